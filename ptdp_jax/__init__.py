"""ptdp_jax: PTD-P (pipeline, tensor and data parallel) training of GPT and LLaMA in JAX.

    from ptdp_jax import train
    result = train("configs/demo.yaml", mesh_shape=(2, 2, 2))
"""
__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "TrainResult", "TrainingStopped", "load_config", "train",
           "validate"]


def __getattr__(name):
    # Lazy, so that light modules (schedules, data, config) import without JAX's start-up cost.
    if name in ("Config", "ConfigError", "load_config", "validate"):
        from ptdp_jax import config
        return getattr(config, name)
    if name in ("TrainResult", "TrainingStopped", "train"):
        from ptdp_jax import train as _train_module
        return getattr(_train_module, name)
    raise AttributeError(f"module 'ptdp_jax' has no attribute {name!r}")
