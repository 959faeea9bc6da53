"""The p = 1 gradient path (training/local_grads.py): the embedding, the layers and the head
differentiated apart, their gradients added into float32 sums carried over the microbatches,
give the loss and gradients of the plain model's `jax.value_and_grad(M.loss_sum)` summed over
the microbatches; with bfloat16 compute the embedding and head sums are float32 sums, not
per-microbatch bfloat16 gradients."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from parity import _joint_qkv_bias, batch_for, tiny_config
from ptdp_jax.models import fused_loss as FL
from ptdp_jax.models import model as M
from ptdp_jax.parallel.sharding import Sharder
from ptdp_jax.training import state as S
from ptdp_jax.training import step


def _path(cfg):
    """(loss, gradient sums in the canonical layout) of the step's p = 1 path on one device."""
    tx, _ = S.make_optimizer(cfg)
    params = jax.jit(lambda: S.init_state(cfg, tx)["params"])()
    grad = jax.jit(lambda p, b: step._microbatch_grads(cfg, Sharder(), p, b, None, ()))
    loss, grads = grad(params, batch_for(cfg))
    return float(loss), jax.tree.map(np.asarray, S.canonical_params(cfg, grads))


def _plain(cfg):
    """The plain model in float32: value_and_grad of M.loss_sum per microbatch, summed."""
    tx, _ = S.make_optimizer(cfg)
    params = jax.jit(lambda: S.canonical_params(cfg, S.init_state(cfg, tx)["params"]))()
    mbs = batch_for(cfg).reshape((cfg.num_microbatches, -1, cfg.model.seq_len + 1))

    def total(p):
        one = jax.value_and_grad(lambda q, t: M.loss_sum(cfg.model, q, t[:, :-1], t[:, 1:]))
        sums = [one(p, t) for t in mbs]
        return jax.tree.map(lambda *x: sum(x[1:], x[0]), *sums)
    loss, grads = jax.jit(total)(params)
    return float(loss), jax.tree.map(np.asarray, grads)


def _rel_errors(got, ref):
    flat, _ = jax.tree.flatten_with_path(_joint_qkv_bias(got))
    return {jax.tree_util.keystr(p): float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))
            for (p, a), b in zip(flat, jax.tree.leaves(_joint_qkv_bias(ref)))}


@pytest.mark.parametrize("arch,micro,chunks", [             # GPT tied, LLaMA untied
    ("gpt", 8, 1), ("gpt", 2, 4), ("llama", 8, 4), ("llama", 2, 1)],
    ids=["gpt-m1", "gpt-m4-chunks4", "llama-m1-chunks4", "llama-m4"])
def test_float32_path_is_the_plain_gradient(arch, micro, chunks, monkeypatch):
    """m = 1 and m = 4 microbatches, the head in one chunk and in 4."""
    cfg = tiny_config(arch, **{"train.micro_batch_size": micro})
    _chunk_bytes(monkeypatch, cfg, chunks)
    loss, grads = _path(cfg)
    loss0, grads0 = _plain(cfg)
    assert loss == pytest.approx(loss0, rel=1e-6)
    assert jax.tree.structure(grads) == jax.tree.structure(grads0)
    errors = _rel_errors(grads, grads0)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("arch,leaves", [
    ("gpt", (("embed", "wte"), ("embed", "wpe"))),         # wte: head and embedding (tied)
    ("llama", (("head", "out"), ("embed", "tok")))], ids=["gpt", "llama"])
def test_bfloat16_head_and_embedding_sums_are_float32(arch, leaves, monkeypatch):
    """One microbatch, the head in 4 chunks: the head weight's and embedding's sums hold
    float32 values (chunks and repeated tokens added in float32, not rounded to bfloat16 at the
    end of the microbatch), close to the float32 gradients."""
    cfg = tiny_config(arch, **{"train.micro_batch_size": 8, "train.dtype": "bfloat16"})
    assert cfg.num_microbatches == 1
    _chunk_bytes(monkeypatch, cfg, 4)
    tx, _ = S.make_optimizer(cfg)
    params = jax.jit(lambda: S.init_state(cfg, tx)["params"])()
    _, sums = jax.eval_shape(lambda p, b: step._microbatch_grads(cfg, Sharder(), p, b, None, ()),
                             params, batch_for(cfg))
    assert {a.dtype for g in ("embed", "head") for a in jax.tree.leaves(sums[g])} == {
        jnp.dtype(jnp.float32)}
    _, grads = _path(cfg)
    _, grads0 = _plain(tiny_config(arch, **{"train.micro_batch_size": 8}))
    for group, name in leaves:
        g = grads[group][name]
        assert (g != g.astype(jnp.bfloat16).astype(np.float32)).any(), name
    errors = _rel_errors({g: grads[g] for g in ("embed", "head")},
                         {g: grads0[g] for g in ("embed", "head")})
    assert max(errors.values()) < 2e-2, errors


def _chunk_bytes(monkeypatch, cfg, chunks: int):
    """The fused head's chunk size set so that a microbatch's head runs in `chunks` chunks."""
    b, s, v = cfg.train.micro_batch_size, cfg.model.seq_len, cfg.model.padded_vocab_size
    monkeypatch.setattr(FL, "CHUNK_BYTES", b * s * v * 4 // chunks)
    assert FL.num_chunks(b, s, v) == chunks
