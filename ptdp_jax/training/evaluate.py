"""Evaluation: the validation loss as a forward pass only (no gradients, no dropout),
on the same mesh and parameter layout as training (a checkpoint's: run/evaluate.py;
the command: cli/eval.py).

    eval_fn = jax.jit(make_eval_fn(cfg, mesh))    # (stage-layout params, batch) -> mean loss
    loss = evaluate(eval_fn, params, feed, cfg.train.eval_batches)

On a pipeline (p > 1) the forward runs as a ring: every tick each stage applies its
model chunk to the activations it holds and passes them on (`ppermute` over 'pipe'),
so after p x v ticks the activations that started on stage 0 have gone through every
chunk in order and stage p - 1 computes the loss. Each data-parallel replica runs its
rows in microbatches of train.micro_batch_size (activation memory as in training, with
nothing stashed).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ptdp_jax.config import decisions as D
from ptdp_jax.models import model as M
from ptdp_jax.pipeline.balance import chunk_layers, chunk_placement
from ptdp_jax.parallel import context as C
from ptdp_jax.parallel.sharding import Sharder, manual_axes, manual_spec, psum_over, vary
from ptdp_jax.training.state import stage_param_specs


def _masked_layers(cfg, sh, layers_p, x_bsh, n, rows=None):
    """The first n of a chunk's (padded) layers: a scan over all of them in which a
    padding layer leaves x unchanged (rows: models/model.layer_rows)."""
    f = M.layer_fn(cfg, sh)
    lmax = jax.tree.leaves(layers_p)[0].shape[0]

    def body(x, sc):
        lp, i = sc
        return jnp.where(i < n, f(lp, x, i, rows), x), None

    x_bsh, _ = jax.lax.scan(body, x_bsh, (layers_p, jnp.arange(lmax, dtype=jnp.int32)))
    return x_bsh


def make_eval_fn(cfg, mesh, hidden: bool = False):
    """(stage-layout params, batch (B, s+1)) -> mean token loss (float32), jit-able.
    hidden: (stage-layout params, tokens (B, n)) -> the last layer's output (B, n, h) on
    every stage (what make_logits_fn puts the head on)."""
    mc, p, v = cfg.model, cfg.parallel.pipe, cfg.parallel.virtual_stages
    manual = manual_axes(mesh)
    sh = Sharder.for_config(cfg, mesh).inside(manual)
    dtype = M.DTYPES[cfg.compute_dtype]
    counts, place = chunk_layers(cfg), chunk_placement(cfg)
    chunk_at = {ij: c for c, ij in enumerate(place)}
    # per_stage[i, j]: layers of virtual chunk j on stage i (global chunk j * p + i; ZB-V: V)
    per_stage = np.asarray([[counts[chunk_at[i, j]] for j in range(v)] for i in range(p)],
                           np.int32)
    n_tokens = cfg.train.global_batch_size * mc.seq_len
    pspecs = stage_param_specs(cfg)
    manual_specs = jax.tree.map(lambda s: manual_spec(s, manual), pspecs)
    data_spec = P("data") if "data" in manual else P()
    eos = None if hidden else D.document_end(cfg)

    def ring(w, inputs):
        """p > 1: one microbatch through the ring of stages (ZB-V: down and back up the V);
        (the last layer's output, whether this stage holds it: the last chunk's stage)."""
        stage = jax.lax.axis_index("pipe")
        here = jnp.asarray(per_stage)[stage]                    # (v,) layer counts
        x = M.embed(mc, sh, w["embed"], inputs)                 # used on stage 0 only
        rows = M.layer_rows(sh, inputs, None, eos)
        for c in range(p * v):
            j = place[c][1]                                     # every stage: its chunk j
            x = _masked_layers(mc, sh, jax.tree.map(lambda a: a[0, j], w["layers"]), x, here[j],
                               rows)
            if c < p * v - 1 and place[c + 1][0] != place[c][0]:
                step = 1 if place[c + 1][0] == (place[c][0] + 1) % p else -1
                x = jax.lax.ppermute(x, "pipe", [(i, (i + step) % p) for i in range(p)])
        return x, stage == place[-1][0]

    def loss_ring(w, tokens):
        x, last = ring(w, tokens[:, :-1])
        return jnp.where(last, M.head_loss(mc, sh, w["embed"], w["head"], x, tokens[:, 1:]), 0.0)

    def loss_flat(w, tokens):
        """p == 1: the whole model on one microbatch."""
        layers = M.to_canonical_layout(w["layers"], counts, 1)
        return M.loss_sum(mc, dict(w, layers=layers), tokens[:, :-1], tokens[:, 1:], sh,
                          dtype=dtype, eos=eos)

    def local(params, batch):
        params = jax.tree.map(lambda x: vary(x, manual), params)
        batch = C.rows_of(batch, cfg.parallel.context)      # a sequence's chunks, as rows
        w = M.cast(params, dtype)
        rows = batch.shape[0]
        b = min(cfg.train.micro_batch_size * (2 if cfg.parallel.context > 1 else 1), rows)
        mbs = batch.reshape((rows // b, b) + batch.shape[1:])
        one = loss_ring if p > 1 else loss_flat
        zero = vary(jnp.zeros((), jnp.float32), manual)
        total, _ = jax.lax.scan(lambda acc, t: (acc + one(w, t).astype(jnp.float32), None),
                                zero, mbs)
        return psum_over(total, manual, P()) / n_tokens

    def local_hidden(params, tokens):
        w = M.cast(jax.tree.map(lambda x: vary(x, manual), params), dtype)
        if p == 1:
            x = M.embed(mc, sh, w["embed"], tokens)
            return psum_over(M.run_layers(mc, sh, M.to_canonical_layout(w["layers"], counts, 1),
                                          x), manual, data_spec)
        x, last = ring(w, tokens)
        return psum_over(jnp.where(last, x, jnp.zeros_like(x)), manual, data_spec)

    fn, out_spec = (local_hidden, data_spec) if hidden else (local, P())
    if not manual:
        return fn
    return jax.shard_map(fn, mesh=mesh, in_specs=(manual_specs, data_spec), out_specs=out_spec,
                         axis_names=set(manual))


def make_logits_fn(cfg, mesh):
    """(stage-layout params, tokens (B, n)) -> logits (B, n, padded vocab) in train.dtype,
    jit-able: the layers as the evaluation runs them (a ring over 'pipe'), the head after."""
    layers = make_eval_fn(cfg, mesh, hidden=True)
    sh = Sharder.for_config(cfg, mesh)
    dtype = M.DTYPES[cfg.compute_dtype]

    def fn(params, tokens):
        w = M.cast(params, dtype)
        return M.logits(cfg.model, sh, w["embed"], w["head"], layers(params, tokens))
    return fn


def evaluate(eval_fn, params, batches, num_batches: int) -> float:
    """Mean loss over the first `num_batches` validation batches (`batches(i)` gives the
    i-th as a sharded array)."""
    return float(np.mean([float(eval_fn(params, batches(i))) for i in range(num_batches)]))
