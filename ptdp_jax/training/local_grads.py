"""The gradient path of p = 1 (ptdp_jax/training/grads.py): the microbatches in one `lax.scan`
whose carry is the float32 sums, each microbatch's gradients added into them where they are made.

The compute copies of the embedding and head (and, through `wrap`, of the layers' GEMM weights)
are made once a step, before the scan; per microbatch the embedding, the layers and the head are
differentiated apart:

    x0 = embed(compute copy of the embedding)         the forward only
    xL, pull = jax.vjp(trunk, layers, x0)             the layers (recomputation, dropout, ...)
    (loss, head sums), dxL = M.head_grads(...)        the fused head's chunks add into the sums
    layer grads, dx0 = pull(dxL)                      added to the sums
    embedding sums += the embedding's vjp(dx0)        against the float32 table: a scatter-add

so per microbatch neither the head nor the embedding casts a weight, fills a zeroed gradient or
rounds its summed gradient to the compute dtype (the head's GEMMs give each chunk's weight
gradient in the compute dtype; it is added in float32).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ptdp_jax.config import decisions as D
from ptdp_jax.models import model as M
from ptdp_jax.training import grads as G


def microbatch_grads(cfg, sh, params, batch_rs1, keys_r, manual, wrap):
    """(loss sum, float32 gradient sums) of this replica's microbatches. params: float32, the
    layers (L, ...); wrap: what the trunk does to the per-layer (or stacked) float32 layer
    params before casting them (step._master_grads' MasterGrad pairs, or nothing)."""
    dtype = M.DTYPES[cfg.compute_dtype]
    mbs, keys = G.microbatches(batch_rs1, keys_r, cfg.num_microbatches)
    split = (lambda t: t) if cfg.scan_layers_on else M.per_layer
    params = split(params)
    compute = M.cast({g: params[g] for g in ("embed", "head")}, dtype)
    one = _microbatch(cfg, sh, dtype, params, compute, wrap)
    sums = G.f32_zeros((jnp.zeros(()), params), manual)
    loss, grads = jax.lax.scan(lambda c, xs: (one(c, *xs), None), sums, (mbs, keys))[0]
    return loss, M.stack_layers(grads)


def _microbatch(cfg, sh, dtype, params, compute, wrap):
    """(loss, sums), tokens (b, s+1), key rows -> the same with the microbatch's loss and
    gradients added."""
    mc, eos = cfg.model, D.document_end(cfg)

    def trunk(layers, x, key_rows):
        return M.run_layers(mc, sh, M.cast(wrap(layers), dtype), x, cfg.remat, key_rows,
                            scan=cfg.scan_layers_on)

    def one(carry, tokens, key_rows):
        loss, sums = carry
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x0 = M.embed(mc, sh, compute["embed"], inputs, key_rows)
        rows = M.layer_rows(sh, inputs, key_rows, eos)
        xl, pull = jax.vjp(lambda lp, x: trunk(lp, x, rows), params["layers"], x0)
        acc = (loss, M.head_embed(mc, sums["embed"]), sums["head"])
        (loss, tied, head), dxl = M.head_grads(mc, sh, acc, M.head_embed(mc, compute["embed"]),
                                               compute["head"], xl, targets)
        g_layers, dx0 = pull(dxl)
        layers = jax.tree.map(lambda a, g: a + g.astype(a.dtype), sums["layers"], g_layers)
        embed = _embed_grads(mc, sh, dict(sums["embed"], **tied), params["embed"], inputs,
                             key_rows, dx0)
        return loss, dict(sums, embed=embed, layers=layers, head=head)
    return one


def _embed_grads(mc, sh, sums, table, inputs, key_rows, dx):
    """sums plus the embedding's gradient for dx, taken against the float32 table, so that
    XLA scatter-adds it into the sum in place (no zeroed table, no compute-dtype copy)."""
    _, pull = jax.vjp(lambda e: M.embed(mc, sh, e, inputs, key_rows), table)
    (grads,) = pull(dx.astype(jnp.float32))
    return jax.tree.map(jnp.add, sums, grads)
