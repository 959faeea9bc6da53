"""Context parallelism (parallel.context, ptdp_jax/parallel/context.py): the blockwise
attention against plain attention, the chunks' load balance, and loss and gradients of a
context-split step against one device on each kind of layout (float32, parity.py's
tolerance; FP8 within parity.py's FP8 bound)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from parity import (assert_close, assert_close_fp8, loss_and_grads, reference, tiny_config)
from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.config.validation import validate
from ptdp_jax.parallel import context as C, flash as F

FP8 = (("train.fp8", True),)


def _plain(q, k, v):
    g = q.shape[2] // k.shape[2]
    return jax.nn.dot_product_attention(q, jnp.repeat(k, g, 2), jnp.repeat(v, g, 2),
                                        is_causal=True)


def _qkv(b=2, s=64, n=4, kv=2, d=16):
    keys = jax.random.split(jax.random.key(0), 4)
    return (*(jax.random.normal(k_, (b, s, h, d)) for k_, h in zip(keys, (n, kv, kv))),
            jax.random.normal(keys[3], (b, s, n, d)))


def test_blockwise_attention_is_attention(monkeypatch):
    monkeypatch.setattr(F, "BLOCK", 8)                       # 8 query and 8 key tiles
    q, k, v, g = _qkv()
    pos = jnp.broadcast_to(jnp.arange(64), (2, 64))
    ours = lambda q, k, v: F.blockwise_attention(q, k, v, pos, 0.25)
    np.testing.assert_allclose(ours(q, k, v), _plain(q, k, v), atol=2e-6)
    for a, b in zip(jax.vjp(ours, q, k, v)[1](g), jax.vjp(_plain, q, k, v)[1](g)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _masked(q, k, v, starts):
    """Plain attention within documents: key j seen by query i where starts[i] <= j <= i."""
    g = q.shape[2] // k.shape[2]
    s = q.shape[1]
    j = jnp.arange(s)
    mask = (j[None, None, :] <= j[None, :, None]) & (j[None, None, :] >= starts[:, :, None])
    return jax.nn.dot_product_attention(q, jnp.repeat(k, g, 2), jnp.repeat(v, g, 2),
                                        mask=mask[:, None])


@pytest.mark.parametrize("c,documents", [(2, False), (4, False), (4, True)])
def test_split_attention_over_devices_is_attention(c, documents, monkeypatch):
    """Each rank's two chunks attend the keys all ranks gathered, in two parts (the chunks
    before, their own) merged; the gradients of the keys and values go back to the ranks that
    hold them. With document starts, also where a document begins inside a chunk or before
    the chunks a rank holds."""
    monkeypatch.setattr(F, "BLOCK", 8)
    q, k, v, g = _qkv()
    starts = jnp.asarray(np.repeat([[0] * 5 + [5] * 14 + [19] * 30 + [49] * 15], 2, 0)
                         if documents else np.zeros((2, 64), np.int32), jnp.int32)
    mesh = Mesh(np.array(jax.devices()[:c]), ("context",))

    def local(q, k, v, starts):
        r = jax.lax.axis_index("context")
        rows = lambda x: C.chunk_order(x, c)[r]
        o = C.attention(rows(q), rows(k), rows(v), c, r, 0.25,
                        rows(starts) if documents else None)
        return jax.lax.all_gather(o, "context", axis=0, tiled=False)

    split = jax.shard_map(local, mesh=mesh, in_specs=(P(),) * 4, out_specs=P(),
                          axis_names={"context"}, check_vma=False)
    ours = lambda q, k, v: C.natural_order(split(q, k, v, starts), c)
    plain = lambda q, k, v: _masked(q, k, v, starts)
    np.testing.assert_allclose(ours(q, k, v), plain(q, k, v), atol=2e-6)
    for a, b in zip(jax.vjp(ours, q, k, v)[1](g), jax.vjp(plain, q, k, v)[1](g)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_parts_merge_to_the_whole_attention():
    """flash.py's interface, the tiled kernel: the attention over keys [0, 40) and, causally,
    over keys [40, 64) of queries 40..63, merged by log-sum-exp, and each part's backward from
    the merged output and log-sum-exp, give the whole attention and its gradients."""
    q, k, v, g = _qkv()
    qs, gs = q[:, 40:], g[:, 40:]
    before = F.Part(False, jnp.full((2,), 40, jnp.int32))
    own = F.Part(True)
    parts = [(k, v, before), (k[:, 40:], v[:, 40:], own)]

    def whole(q, k, v):                              # queries at positions 40..63
        return _plain(jnp.concatenate([jnp.zeros_like(q[:, :1]).repeat(40, 1), q], 1),
                      k, v)[:, 40:]
    o, lse = F.merge([F.forward("tiled", qs, kk, vv, p, 0.25) for kk, vv, p in parts])
    np.testing.assert_allclose(o, whole(qs, k, v), atol=2e-6)
    dq = sum(F.backward("tiled", qs, kk, vv, p, o, lse, gs, 0.25)[0] for kk, vv, p in parts)
    np.testing.assert_allclose(dq, jax.vjp(lambda q: whole(q, k, v), qs)[1](gs)[0], atol=1e-5)


@pytest.mark.parametrize("c", [1, 2, 4, 8])
def test_every_rank_does_the_same_attention_work(c):
    """Ranks i and 2c-1-i's chunks: the (query, key) pairs each rank computes are equal, and
    together they are every pair of the causal square, once."""
    s = 64
    L = s // (2 * c)
    work = [int(np.sum(np.asarray(C.positions(c, r, L, 2)) + 1)) for r in range(c)]
    assert len(set(work)) == 1 and sum(work) == s * (s + 1) // 2
    seen = np.sort(np.concatenate([np.asarray(C.positions(c, r, L, 2)).ravel()
                                   for r in range(c)]))
    np.testing.assert_array_equal(seen, np.arange(s))


def test_chunks_round_trip():
    x = jnp.arange(2 * 32).reshape(2, 32)
    np.testing.assert_array_equal(C.natural_order(C.chunk_order(x, 4), 4), x)
    tokens = jnp.arange(2 * 33).reshape(2, 33)
    rows = C.local_rows(tokens, 2, 1)                       # chunks 1 and 2 of 4, + next token
    np.testing.assert_array_equal(rows[0], tokens[0, 8:17])
    np.testing.assert_array_equal(rows[1], tokens[0, 16:25])


# (arch, (data, pipe, tensor), overrides): each kind of layout with context parallelism
LAYOUTS = [
    ("llama", (1, 1, 1), {"parallel.context": 2}),
    ("gpt", (1, 1, 1), {"parallel.context": 4}),
    ("llama", (1, 1, 1), {"parallel.context": 8}),
    ("llama", (2, 1, 1), {"parallel.context": 2, "parallel.zero": 3}),
    ("llama", (1, 1, 2), {"parallel.context": 2, "parallel.sequence_parallel": True,
                          "model.num_kv_heads": 4}),
    ("gpt", (1, 2, 1), {"parallel.context": 2, "parallel.schedule": "zb-phased",
                        "parallel.virtual_stages": 2}),
    ("llama", (1, 2, 1), {"parallel.context": 2, "parallel.schedule": "interleaved",
                          "parallel.virtual_stages": 2}),
    ("gpt", (1, 2, 1), {"parallel.context": 2, "train.recompute": "full"}),
    ("llama", (2, 1, 2), {"parallel.context": 2, "parallel.zero": 1}),
    ("llama", (1, 1, 1), {"parallel.context": 4, "parallel.zero": 3}),
    ("gpt", (2, 1, 1), {"parallel.context": 2, "parallel.zero": 2}),
]
IDS = ["c2", "c4-gpt", "c8", "d2-zero3", "t2-sp-gqa", "zb-phased-v2", "interleaved",
       "1f1b-full", "d2-t2-zero1", "c4-zero3", "d2-c2-zero2"]


def test_heads_over_tensor_run_the_attention_once(monkeypatch):
    """With heads over an automatic 'tensor' the attention runs in a per-device region; its
    backward takes the forward's residuals, so the step holds the same attention work (loops,
    GEMMs, exponentials) as the one-device step, not a second forward; and what the region
    hands its backward is less than one copy of its output (the statistics: the output is
    the region's own, not kept twice)."""
    from jaxprs import step_work
    from ptdp_jax.models import residuals as R
    cfg = lambda mesh, **extra: tiny_config("llama", mesh, **{"parallel.context": 2,
                                            "model.num_kv_heads": 4}, **extra)
    kept, split = [], R.Residuals.split
    monkeypatch.setattr(R.Residuals, "split", lambda self, pull, known: kept.append(
        (split(self, pull, known), known[3])) or kept[-1][0])
    one = step_work(cfg((1, 1, 1)))
    assert step_work(cfg((1, 1, 2), **{"parallel.sequence_parallel": True})) == one
    assert one["exp"] > 0 and kept
    assert all(sum(a.size for a in leaves) < out.size for leaves, out in kept)


def test_context_gathers_the_key_value_heads_only():
    """Grouped-query attention: each layer all-gathers K and V with their own heads (2 of 8
    here), not repeated to the query heads, so it moves heads / kv_heads fewer bytes."""
    from jaxprs import equations
    from parity import batch_for
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training import state as S, step
    cfg = tiny_config("llama", (1, 1, 1), **{"parallel.context": 2, "model.num_kv_heads": 2})
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
    gathered = [eqn.invars[0].aval.shape for eqn, _ in equations(
        jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0).jaxpr)
        if eqn.primitive.name == "all_gather" and eqn.invars[0].aval.ndim == 4]
    assert gathered and all(shape[2] == 2 for shape in gathered), gathered


@pytest.mark.parametrize("mesh,extra", [((1, 1, 1), {}), ((1, 1, 2), {
    "parallel.sequence_parallel": True, "model.num_kv_heads": 4})], ids=["c2", "c2-t2-sp"])
def test_selective_runs_the_split_attention_once(mesh, extra):
    """Selective recomputation keeps the split attention's output and statistics: its
    backward runs no attention forward again (no second gather of the keys and values), the
    same attention work as without recomputation."""
    from jaxprs import step_work
    work = {r: step_work(tiny_config("llama", mesh, **{"parallel.context": 2,
                                                        "train.recompute": r}, **extra))
            for r in ("none", "selective")}
    assert work["selective"] == work["none"] and work["none"]["all_gather"] > 0


@pytest.mark.parametrize("arch,mesh,extra", LAYOUTS, ids=IDS)
def test_context_parity(arch, mesh, extra):
    base = {k: v for k, v in extra.items() if k == "model.num_kv_heads"}
    ref = loss_and_grads(tiny_config(arch, (1, 1, 1), **base)) if base else reference(arch)
    assert_close(loss_and_grads(tiny_config(arch, mesh, **extra)), ref)


@pytest.mark.parametrize("arch,mesh,extra", [
    ("llama", (1, 1, 1), {"parallel.context": 2}),
    ("gpt", (1, 2, 1), {"parallel.context": 2, "parallel.schedule": "zb-phased"}),
    ("llama", (1, 1, 2), {"parallel.context": 2, "parallel.sequence_parallel": True})],
    ids=["c2", "zb-phased", "t2-sp"])
def test_context_parity_fp8(arch, mesh, extra):
    """A scale is the max over a tensor's chunks on every rank, as on one device (the delayed
    recipe's history: test_fp8_delayed.py)."""
    got = loss_and_grads(tiny_config(arch, mesh, **dict(FP8), **extra))
    assert_close_fp8(got, reference(arch, FP8), reference(arch))


def test_the_evaluation_step_splits_the_sequence_too():
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training import state as S
    from ptdp_jax.training.evaluate import make_eval_fn
    from parity import batch_for
    losses = []
    for extra in ({}, {"parallel.context": 4}):
        cfg = tiny_config("llama", (1, 1, 1), **extra)
        params = jax.jit(lambda: S.init_state(cfg, S.make_optimizer(cfg)[0])["params"])()
        fn = jax.jit(make_eval_fn(cfg, make_mesh(cfg.parallel.mesh_dims)))
        losses.append(float(fn(params, batch_for(cfg))))
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-6)


@pytest.mark.parametrize("overrides,words", [
    ({"parallel.context": 3}, "model.seq_len=16 is not divisible by 2 x parallel.context = 6"),
    ({"parallel.context": 2, "model.dropout": 0.1}, "dropout under context parallelism"),
    ({"parallel.context": 4, "parallel.data": 4},
     "with parallel.context=4 needs 16 devices, only 8 available"),
    ({"parallel.context": 0}, "parallel.context must be positive")])
def test_bad_context_settings_are_one_clear_error(overrides, words):
    cfg = load_config(overrides={"model.seq_len": 16, **overrides})
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate(cfg, 8)


def test_a_checkpoint_continues_at_another_context_size(tmp_path, data_cache):
    """Context parallelism shapes no state: the unsplit run's step-2 checkpoint resumed with
    each sequence over 4 devices takes the unsplit run's steps 3 and 4, and that run's step-4
    checkpoint resumed unsplit takes its steps 5 and 6."""
    import shutil

    import helpers_ckpt as H
    from ptdp_jax.run.loop import train
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 6, "checkpoint.every": 2})
    whole = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log()).losses
    ck = tmp_path / "ckpt-split"
    shutil.copytree(tmp_path / "ckpt", ck)
    split = train(mesh_shape=(1, 1, 1), log=H.Log(), overrides={
        **ov, "checkpoint.dir": str(ck), "checkpoint.resume_step": 2,
        "checkpoint.resume": "overwrite", "parallel.context": 4, "train.stop_at_step": 4}).losses
    back = train(mesh_shape=(1, 1, 1), log=H.Log(),
                 overrides={**ov, "checkpoint.dir": str(ck)}).losses
    np.testing.assert_allclose(split + back, whole[2:], rtol=2e-5)


@pytest.mark.parametrize("mesh,c", [((1, 1, 1), 4), ((2, 1, 1), 2)])
def test_zero_splits_the_state_over_data_and_context(mesh, c):
    """The weights are replicated over data and context, so ZeRO splits their state over
    both: each device holds 1/(d c) of a split tensor, and the estimate counts that."""
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training import state as S
    from ptdp_jax.training.memory import params_per_device
    cfg = tiny_config("llama", mesh, **{"parallel.context": c, "parallel.zero": 3})
    tx, _ = S.make_optimizer(cfg)
    shardings = S.state_shardings(cfg, make_mesh(cfg.parallel.mesh_dims), tx)
    state = jax.eval_shape(lambda: S.init_state(cfg, tx))
    w, sharding = state.params["layers"]["w_up"], shardings.params["layers"]["w_up"]
    ways = mesh[0] * c
    assert np.prod(sharding.shard_shape(w.shape)) * ways == np.prod(w.shape)
    whole = tiny_config("llama", (1, 1, 1))
    assert params_per_device(cfg, state=True)["layers"] * ways == pytest.approx(
        params_per_device(whole)["layers"], rel=0.05)
