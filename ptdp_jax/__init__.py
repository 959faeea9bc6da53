"""ptdp_jax: PTD-P (pipeline, tensor and data parallel) training of GPT and LLaMA in JAX.

    from ptdp_jax import train
    result = train("configs/demo.yaml", mesh_shape=(2, 2, 2))
    model = ptdp_jax.load("ckpt/")          # a checkpoint: .logits(tokens), .generate(...)
"""
from ptdp_jax.config.load import Config, ConfigError, load_config
from ptdp_jax.config.validation import validate
# Binds the name `train` to the function (the submodule stays importable as ptdp_jax.run.loop).
from ptdp_jax.run.loop import TrainResult, TrainingStopped, train

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "Model", "TrainResult", "TrainingStopped", "load",
           "load_config", "train", "validate"]


def __getattr__(name):
    """`load` and `Model` (ptdp_jax.run.inference) are imported on first use."""
    if name in ("load", "Model"):
        from ptdp_jax.run import inference as inference
        return getattr(inference, name)
    raise AttributeError(f"module 'ptdp_jax' has no attribute {name!r}")
