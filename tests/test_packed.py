"""Document-masked attention in cuDNN's packed layout (parallel/packed.py), on CPU through a
stand-in for cuDNN's call: the same segments, its softmax statistics laid out as cuDNN keeps
them (the valid segments in row order, a segment's queries from 0) and NaN outside every
segment, so that what packed.py reads back and what it leaves are both checked. Against
attention with the document mask written out: the whole sequence, a context-split one, and
the model's loss and gradients against the tiled kernel."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from parity import assert_close, loss_and_grads, tiny_config
from ptdp_jax.parallel import context as C, flash as F, packed
from test_documents import DM, EOS, _mask, doc_batch


def _visible(call, nq, ns, causal):
    """(b, nq, ns) which keys each query sees, segment by segment."""
    t, s = jnp.arange(nq), jnp.arange(ns)
    vis = jnp.zeros((call.q_off.shape[0], nq, ns), bool)
    for m in range(packed.PAIR):
        qo, ql = call.q_off[:, m, None], call.q_len[:, m, None]
        ko, kl = call.kv_off[:, m, None], call.kv_len[:, m, None]
        qin = (ql > 0) & (t >= qo) & (t < qo + ql)
        kin = (kl > 0) & (s >= ko) & (s < ko + kl)
        both = qin[:, :, None] & kin[:, None, :]
        if causal:
            both &= (s[None, None] - ko[:, :, None]) <= (t[None, :, None] - qo[:, :, None])
        vis |= both
    return vis


def _stats_rows(call, lse_bnq):
    """lse (b, n, q) -> cuDNN's statistics layout, row by row with a counter."""
    b, n, nq = lse_bnq.shape
    out, r = jnp.zeros((b * packed.PAIR, n, nq), jnp.float32), 0
    for i in range(b):
        for m in range(packed.PAIR):
            ok = call.q_len[i, m] > 0
            row = jnp.roll(lse_bnq[i], -call.q_off[i, m], axis=1)
            out = jnp.where(ok, jax.lax.dynamic_update_index_in_dim(out, row, r, 0), out)
            r = r + ok.astype(jnp.int32)
    return out


def _lse_rows(call, stats, nq):
    """The inverse of _stats_rows (-inf outside the segments)."""
    b = call.q_off.shape[0]
    lse, r = jnp.full((b, stats.shape[1], nq), -jnp.inf), 0
    t = jnp.arange(nq)
    for i in range(b):
        for m in range(packed.PAIR):
            ok = call.q_len[i, m] > 0
            row = jnp.roll(jax.lax.dynamic_index_in_dim(stats, r, 0, False), call.q_off[i, m],
                           axis=1)
            inside = ok & (t >= call.q_off[i, m]) & (t < call.q_off[i, m] + call.q_len[i, m])
            lse = lse.at[i].set(jnp.where(inside[None], row, lse[i]))
            r = r + ok.astype(jnp.int32)
    return lse


def _scores(q, k, call, causal, scale):
    g = q.shape[2] // k.shape[2]
    s = jnp.einsum("bqnd,bsnd->bnqs", q, jnp.repeat(k, g, 2)) * scale
    vis = _visible(call, q.shape[1], k.shape[1], causal)[:, None]
    return jnp.where(vis, s, -jnp.inf), vis


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def fake_cudnn(q, k, v, call, causal, scale):
    return _fake_fwd(q, k, v, call, causal, scale)[0]


def _fake_fwd(q, k, v, call, causal, scale):
    s, vis = _scores(q, k, call, causal, scale)
    lse = jax.nn.logsumexp(s, axis=-1)                                   # (b, n, q)
    p = jnp.where(vis, jnp.exp(s - lse[..., None]), 0.0)
    o = jnp.einsum("bnqs,bsnd->bqnd", p, jnp.repeat(v, q.shape[2] // k.shape[2], 2))
    o = jnp.where(vis.any(-1).transpose(0, 2, 1)[..., None], o, jnp.nan)
    return o, (q, k, v, call, _stats_rows(call, lse), o)


def _fake_bwd(causal, scale, res, g):
    q, k, v, call, stats, o = res
    gq = q.shape[2] // k.shape[2]
    s, vis = _scores(q, k, call, causal, scale)
    lse = _lse_rows(call, stats, q.shape[1])
    p = jnp.where(vis, jnp.exp(s - jnp.where(vis.any(-1), lse, 0.0)[..., None]), 0.0)
    vr, kr = jnp.repeat(v, gq, 2), jnp.repeat(k, gq, 2)
    g = jnp.where(jnp.isfinite(o), g, 0.0)
    delta = jnp.einsum("bqnd,bqnd->bnq", g, jnp.nan_to_num(o))
    dp = jnp.einsum("bqnd,bsnd->bnqs", g, vr)
    ds = p * (dp - delta[..., None]) * scale
    dq = jnp.einsum("bnqs,bsnd->bqnd", ds, kr)
    fold = lambda x: x.reshape(x.shape[:2] + (k.shape[2], gq, x.shape[-1])).sum(3)
    dk, dv = fold(jnp.einsum("bnqs,bqnd->bsnd", ds, q)), fold(jnp.einsum("bnqs,bqnd->bsnd", p, g))
    q_in = vis.any(-1).any(1)[..., None, None]                           # (b, q, 1, 1)
    k_in = vis.any(-2).any(1)[..., None, None]
    return (jnp.where(q_in, dq, jnp.nan), jnp.where(k_in, dk, jnp.nan),
            jnp.where(k_in, dv, jnp.nan), None)


fake_cudnn.defvjp(_fake_fwd, _fake_bwd)


@pytest.fixture
def emulated(monkeypatch):
    """The stand-in in cuDNN's place; yields the list of the calls' causal flags."""
    calls = []

    def fake(q, k, v, call, causal, scale):
        calls.append(causal)
        return fake_cudnn(q, k, v, call, causal, scale)
    monkeypatch.setattr(packed, "segment_attention", fake)
    monkeypatch.setattr(packed, "available", lambda: True)
    yield calls


def _qkv_starts(seed=1, b=3, s=64, every=9):
    keys = jax.random.split(jax.random.key(seed), 4)
    q, g = (jax.random.normal(k_, (b, s, 4, 16)) for k_ in keys[:2])
    k, v = (jax.random.normal(k_, (b, s, 2, 16)) for k_ in keys[2:])
    tokens = doc_batch(tiny_config(**{"model.seq_len": s, "train.global_batch_size": b}),
                       seed=seed, every=every)[:, :-1]
    tokens[-1] = 1                                  # a row of one document
    return q, k, v, g, C.document_starts(jnp.asarray(tokens), EOS, 1)


def _plain(starts):
    return lambda q, k, v: jax.nn.dot_product_attention(
        q, jnp.repeat(k, 2, 2), jnp.repeat(v, 2, 2), mask=_mask(starts)[:, None], scale=0.25)


def test_document_pairs_cover_every_document_once():
    _, _, _, _, starts = _qkv_starts()
    call_of, n = packed.document_pairs(starts)
    docs = np.asarray(jnp.sum(starts == jnp.arange(64), axis=1))
    assert int(n) == (docs.max() + 1) // 2
    seen = np.stack([np.asarray(call_of(i).q_seg) >= 0 for i in range(int(n))])
    np.testing.assert_array_equal(seen.sum(0), 1)             # each query in one call
    lengths = np.concatenate([np.asarray(call_of(i).q_len) for i in range(int(n))], axis=1)
    np.testing.assert_array_equal(np.where(lengths > 0, lengths, 0).sum(1), 64)


def test_document_attention_is_masked_attention(emulated):
    q, k, v, g, starts = _qkv_starts()
    ours = jax.jit(lambda q, k, v: F.document_attention(q, k, v, starts, 0.25))
    np.testing.assert_allclose(ours(q, k, v), _plain(starts)(q, k, v), atol=2e-6)
    for a, b in zip(jax.vjp(ours, q, k, v)[1](g), jax.vjp(_plain(starts), q, k, v)[1](g)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("c", [2, 4])
def test_split_document_attention_is_masked_attention(c, emulated):
    """Each chunk's queries: the document begun before their chunk (one segment of earlier
    keys) and their own chunk's documents in pairs, merged."""
    q, k, v, g, starts = _qkv_starts(seed=2, b=2, every=7)
    mesh = Mesh(np.array(jax.devices()[:c]), ("context",))

    def local(q, k, v, starts):
        r = jax.lax.axis_index("context")
        rows = lambda x: C.chunk_order(x, c)[r]
        o = C.attention(rows(q), rows(k), rows(v), c, r, 0.25, rows(starts), "cudnn")
        return jax.lax.all_gather(o, "context", axis=0, tiled=False)

    split = jax.shard_map(local, mesh=mesh, in_specs=(P(),) * 4, out_specs=P(),
                          axis_names={"context"}, check_vma=False)
    ours = lambda q, k, v: C.natural_order(split(q, k, v, starts), c)
    grads = jax.jit(lambda q, k, v, g: jax.vjp(ours, q, k, v)[1](g))
    np.testing.assert_allclose(jax.jit(ours)(q, k, v), _plain(starts)(q, k, v), atol=2e-6)
    for a, b in zip(grads(q, k, v, g), jax.vjp(_plain(starts), q, k, v)[1](g)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("mesh,extra", [((1, 1, 1), {}), ((1, 1, 1), {"parallel.context": 2}),
                                        ((1, 1, 2), {"parallel.sequence_parallel": True})],
                         ids=["one", "c2", "t2-sp"])
def test_packed_document_mask_parity(mesh, extra, emulated):
    """The model's loss and gradients with document masking in the packed kernel against
    one device's tiled kernel."""
    one = tiny_config("llama", (1, 1, 1), **DM)
    batch = doc_batch(one)
    ref = loss_and_grads(one, batch=batch)
    cfg = tiny_config("llama", mesh, **DM, **extra, **{"tuning.attention": "cudnn"})
    assert_close(loss_and_grads(cfg, batch=batch), ref)
    assert True in emulated and (False in emulated) == ("parallel.context" in extra)


@pytest.mark.parametrize("attention", ["cudnn", "xla"], ids=["packed", "tiled"])
def test_selective_runs_the_document_attention_once(attention, emulated):
    """Selective recomputation keeps the masked attention's output and statistics (the packed
    kernel's and the tiled one's): its backward runs no attention forward again."""
    from jaxprs import step_work
    work = {r: step_work(tiny_config("llama", (1, 1, 1), **DM, **{
        "train.recompute": r, "tuning.attention": attention})) for r in ("none", "selective")}
    assert work["selective"] == work["none"] and work["none"]["while"] > 0
