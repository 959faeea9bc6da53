"""A checkpoint as a model to call from Python: `ptdp_jax.load`.

    import ptdp_jax
    model = ptdp_jax.load("ckpt/")                         # one device
    model = ptdp_jax.load("ckpt/", mesh_shape=(1, 2, 2))   # over 4 devices: pipe 2, tensor 2
    ids = model.tokenizer.encode("The ")
    model.logits([ids])                                    # (1, n, vocab_size) float32 numpy
    new = model.generate(ids, 20, temperature=0.8, top_k=40)
    print(model.tokenizer.decode(new))

On a mesh the layers run as ptdp-eval runs them (a ring over 'pipe', tensor parallelism by
GSPMD), in the training run's layout where it fits the mesh, else in one that does
(evaluate.layout_for_mesh). Computation is in float32 unless `dtype='bfloat16'`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.config.load import Config, DataConfig


def _pick(logits_v, key, vocab: int, temperature: float, top_k: int):
    """The next id from one position's logits: greedy at temperature 0, else sampled from
    softmax(logits / temperature) among the top_k likeliest (0: all); padding ids never."""
    logits_v = jnp.where(jnp.arange(logits_v.shape[0]) < vocab,
                         logits_v.astype(jnp.float32), -jnp.inf)
    if temperature == 0:
        return jnp.argmax(logits_v)
    logits_v = logits_v / temperature
    if top_k and top_k < vocab:
        kth = jax.lax.top_k(logits_v, top_k)[0][-1]
        logits_v = jnp.where(logits_v >= kth, logits_v, -jnp.inf)
    return jax.random.categorical(key, logits_v)


@dataclass
class Model:
    """A loaded checkpoint: `logits` and `generate` (see the module doc). `config` is the
    training run's; `layout` the one the forward runs in on `mesh` (None: one device)."""
    config: Config
    params: Any                        # canonical on one device, stage layout on a mesh
    step: int
    step_dir: Path
    mesh: Any = None
    layout: Config | None = None
    dtype: str = "float32"
    _fns: dict = field(default_factory=dict, repr=False)
    _tokenizer: Any = field(default=None, repr=False)

    @property
    def tokenizer(self):
        """The tokenizer of the training data (the copy the checkpoint keeps, if any)."""
        if self._tokenizer is None:
            from ptdp_jax.checkpoint.format import checkpoint_tokenizer
            from ptdp_jax.data.sources import model_tokenizer
            self._tokenizer = model_tokenizer(list(self.config.data.path),
                                              self.config.model.vocab_size, None,
                                              checkpoint_tokenizer(self.step_dir))[1]
        return self._tokenizer

    def _forward(self):
        """(params, tokens (B, n)) -> logits (B, n, padded vocab), jitted once."""
        if "fwd" not in self._fns:
            if self.mesh is None:
                from ptdp_jax.models import model as M
                from ptdp_jax.parallel.sharding import Sharder
                mc, sh, dt = self.config.model, Sharder(), M.DTYPES[self.dtype]

                def fwd(params, tokens):
                    w = M.cast(params, dt)
                    x = M.run_layers(mc, sh, w["layers"], M.embed(mc, sh, w["embed"], tokens))
                    return M.logits(mc, sh, w["embed"], w["head"], x)
            else:
                from ptdp_jax.training.evaluate import make_logits_fn
                fwd = make_logits_fn(self.layout, self.mesh)
            self._fns["fwd"] = fwd
        return self._fns["fwd"]

    def _rows(self, tokens) -> tuple[np.ndarray, int]:
        """tokens as int32 (B', n), B' padded to a multiple of the mesh's data size."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim == 1:
            tokens = tokens[None]
        s = self.config.model.seq_len
        if tokens.ndim != 2 or not 1 <= tokens.shape[1] <= s or not tokens.shape[0]:
            raise ValueError(f"tokens of shape {tokens.shape}: give (batch, n) ids with "
                             f"1 <= n <= model.seq_len={s}")
        if tokens.min() < 0 or tokens.max() >= self.config.model.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.config.model.vocab_size})")
        d = 1 if self.mesh is None else self.mesh.shape["data"]
        rows, n = tokens.shape
        pad = -rows % d
        return (np.concatenate([tokens, np.zeros((pad, n), np.int32)]) if pad else tokens), rows

    def logits(self, tokens) -> np.ndarray:
        """Logits (B, n, model.vocab_size) as float32 numpy of token ids (B, n) (or (n,):
        one row), n <= model.seq_len."""
        batch, rows = self._rows(tokens)
        if "logits" not in self._fns:
            self._fns["logits"] = jax.jit(self._forward())
        out = self._fns["logits"](self.params, self._put(batch))
        return np.asarray(out[:rows, :, :self.config.model.vocab_size], np.float32)

    def _put(self, batch):
        if self.mesh is None:
            return jnp.asarray(batch)
        from jax.sharding import NamedSharding, PartitionSpec as P
        return jax.device_put(batch, NamedSharding(self.mesh, P("data")))

    def generate(self, prompt_tokens, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = 0, seed: int = 0) -> list[int]:
        """`max_new_tokens` ids after `prompt_tokens`: greedy at temperature 0, else sampled
        (top_k: among the k likeliest; 0: all), the draws a function of seed and position.
        Contexts longer than model.seq_len keep their last model.seq_len ids."""
        if max_new_tokens < 0 or temperature < 0 or top_k < 0:
            raise ValueError("max_new_tokens, temperature and top_k must be >= 0")
        prompt = [int(i) for i in prompt_tokens]
        mc = self.config.model
        if self.mesh is None:
            from ptdp_jax.run.generate import generate
            from ptdp_jax.models import model as M
            return generate(mc, M.cast(self.params, M.DTYPES[self.dtype]), prompt,
                            max_new_tokens, temperature=temperature, top_k=top_k, seed=seed)
        key = ("next", float(temperature), int(top_k))
        if key not in self._fns:
            fwd = self._forward()
            self._fns[key] = jax.jit(lambda params, window, last, k: _pick(
                fwd(params, window)[0, last], k, mc.vocab_size, temperature, top_k))
        ids, out, root = prompt or [0], [], jax.random.key(seed)
        for i in range(max_new_tokens):
            ctx = ids[-mc.seq_len:]
            window, _ = self._rows(np.asarray([ctx + [0] * (mc.seq_len - len(ctx))]))
            tok = int(self._fns[key](self.params, self._put(window), len(ctx) - 1,
                                     jax.random.fold_in(root, i)))
            ids.append(tok)
            out.append(tok)
        return out


def load(ckpt_dir: str | os.PathLike, mesh_shape=None, *, dtype: str = "float32") -> Model:
    """The checkpoint `ckpt_dir` (a checkpoint.dir: its newest step, or one step directory)
    as a Model on one device, or spread over the first d*p*t devices as mesh_shape
    (data, pipe, tensor) says. CheckpointError for a directory that is not a checkpoint,
    ConfigError for a mesh the model cannot be split over."""
    from ptdp_jax.checkpoint.format import load_params, read_meta, resolve_step_dir
    from ptdp_jax.config.load import ConfigError
    if dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"dtype={dtype!r}: float32 or bfloat16")
    step_dir = resolve_step_dir(ckpt_dir)
    cfg, params = load_params(step_dir)
    step = int(read_meta(step_dir)["step"])
    if mesh_shape is None:
        return Model(cfg, jax.tree.map(jnp.asarray, params), step, step_dir, dtype=dtype)
    from jax.sharding import NamedSharding
    from ptdp_jax.run.evaluate import layout_for_mesh
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import stage_param_specs, stage_params
    shape = tuple(int(a) for a in mesh_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"mesh_shape must be three positive ints (data, pipe, tensor), "
                          f"got {mesh_shape}")
    # what a forward pass needs of the training config: no data, no sequence parallelism
    # (any length n), no FP8; a batch that any schedule's microbatch rule accepts
    fwd = replace(cfg, data=DataConfig(),
                  train=replace(cfg.train, global_batch_size=shape[0] * shape[1],
                                micro_batch_size=1,
                                dtype=dtype, fp8=False),
                  parallel=replace(cfg.parallel, sequence_parallel=False, scatter_gather=False),
                  tuning=replace(cfg.tuning, tp_comm_overlap=False))
    layout = layout_for_mesh(fwd, shape, (), len(jax.devices()))
    mesh = make_mesh(shape)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), stage_param_specs(layout))
    stage = jax.jit(lambda x: stage_params(layout, x), out_shardings=shardings)(params)
    return Model(cfg, stage, step, step_dir, mesh=mesh, layout=layout, dtype=dtype)
