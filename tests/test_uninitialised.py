"""The executor's buffers that the schedule writes before it reads them (stash, W stash,
receive and send buffers) start uninitialised where 'tensor' is 1 (decisions.empty_buffers,
`executor.empty_buffer`:
XLA's AllocateBuffer on GPU, no fill and no copy into the loop). Here they start as NaN: any
read of a slot before its write, or any idle stage's garbage reaching a sum, would turn the
loss or a gradient into NaN. The loss and every gradient must come out bit for bit as with
zeros (CPU: `lax.empty` is zeros), on pure and data-parallel meshes, for every executor path
(ticks, phased loops, interleaved, static and indexed stash, W stash, ZB-V's turn, the head
over the pipe with and without its conditional)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from parity import loss_and_grads, tiny_config
from ptdp_jax.config import decisions as D
from ptdp_jax.pipeline import executor

CASES = [
    ("gpt", (1, 4, 1), {"parallel.schedule": "1f1b"}),
    ("gpt", (2, 2, 1), {"parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2}),
    ("llama", (1, 2, 1), {"parallel.schedule": "zb-phased", "parallel.virtual_stages": 2,
                          "tuning.static_stash": False}),
    ("gpt", (2, 4, 1), {"parallel.schedule": "zb-phased", "train.recompute": "selective"}),
    ("gpt", (1, 2, 1), {"parallel.schedule": "zb-v", "parallel.virtual_stages": 2}),
    ("gpt", (1, 2, 1), {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
    ("gpt", (1, 4, 1), {"parallel.schedule": "zb-phased", "parallel.virtual_stages": 2}),
    ("gpt", (1, 2, 1), {"parallel.schedule": "gpipe"}),
    ("llama", (2, 2, 1), {"parallel.schedule": "zb-h1", "train.recompute": "selective"}),
]


@pytest.mark.parametrize("arch,mesh,extra", CASES,
                         ids=["1f1b-141", "phased-v2-221", "zb-phased-v2-dyn-121-llama",
                              "zb-phased-241-sel", "zb-v-121", "interleaved-v2-121",
                              "zb-phased-v2-141-overlap", "gpipe-121", "zb-h1-221-llama-sel"])
def test_buffers_written_before_read(arch, mesh, extra, monkeypatch):
    cfg = tiny_config(arch, mesh, **extra)
    ref = loss_and_grads(cfg)
    calls = []

    def nan_buffer(shape, dtype):
        calls.append(shape)
        return jnp.full(shape, jnp.nan, dtype)
    monkeypatch.setattr(executor, "empty_buffer", nan_buffer)
    got = loss_and_grads(cfg)
    assert calls, "no buffer went through executor.empty_buffer"
    assert np.isfinite(got[0]) and got[0] == ref[0]
    flat_got, flat_ref = jax.tree.leaves(got[1]), jax.tree.leaves(ref[1])
    assert len(flat_got) == len(flat_ref)
    for a, b in zip(flat_got, flat_ref):
        np.testing.assert_array_equal(a, b)


def test_nan_in_a_sum_would_show(monkeypatch):
    """The check above can fail: NaN where the table does read before writing (the float32
    sums and the loss, which start from the executor's jnp.zeros) reaches the results."""
    class NanZeros:                  # jax.numpy for the executor only, zeros made NaN
        def __getattr__(self, name):
            return getattr(jnp, name)

        @staticmethod
        def zeros(shape, dtype=None):
            return jnp.full(shape, jnp.nan, dtype)
    monkeypatch.setattr(executor, "jnp", NanZeros())
    loss, grads = loss_and_grads(tiny_config("gpt", (1, 2, 1),
                                             **{"parallel.schedule": "1f1b-phased"}))
    assert np.isnan(loss) and any(np.isnan(g).any() for g in jax.tree.leaves(grads))


def test_gpu_lowering_allocates_without_filling(monkeypatch):
    """Lowered for CUDA (on this CPU machine), each such buffer is one `AllocateBuffer` custom
    call, which XLA neither fills nor copies into the loop (zeros are one broadcast copied
    into every buffer: 167 `copy(broadcast)` in a pipelined 1.3B step's GPU HLO); for CPU it
    is zeros."""
    from compiled import _lowered
    made = []
    real = executor.empty_buffer

    def counted(shape, dtype):
        made.append(shape)
        return real(shape, dtype)
    monkeypatch.setattr(executor, "empty_buffer", counted)
    cfg = tiny_config("gpt", (1, 2, 1), **{"parallel.schedule": "zb-phased",
                                            "parallel.virtual_stages": 2})
    traced = _lowered(cfg, trace_only=True)
    cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    allocated = cuda.count("@AllocateBuffer(")
    # each buffer one allocation; a few the program never uses are dropped (488 -> 475 here)
    assert made and 0.9 * len(made) <= allocated <= len(made)
    assert "AllocateBuffer" not in cpu
    # with tensor parallelism the buffers stay zeros (the partitioner would slice a whole-shape
    # allocation on every tensor rank)
    made.clear()
    tp = _lowered(tiny_config("gpt", (1, 2, 2), **{"parallel.schedule": "zb-phased"}),
                  trace_only=True).lower(lowering_platforms=("cuda",)).as_text()
    assert not made and "AllocateBuffer" not in tp


def _steady_pair_bodies(jaxpr):
    """The bodies of the scans whose rows hold two switches: the phased steady pairs."""
    found = []

    def walk(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "scan":
                body = eqn.params["jaxpr"].jaxpr
                if sum(e.primitive.name == "cond" for e in body.eqns) == 2:
                    found.append(body)
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)
    walk(jaxpr)
    return found


@pytest.mark.parametrize("overlap", [False, True])
def test_overlap_p2p_keeps_the_forward_message_out_of_the_backward_switch(overlap, monkeypatch):
    """decisions.overlap_p2p: in a steady (forward, backward) pair, the forward row's permute
    feeds nothing that the backward row's switch takes, so XLA may run it under that op;
    without it (the rule patched off: the control) the arrival is filed into the receive
    buffer before the switch."""
    from compiled import _lowered
    monkeypatch.setattr(D, "overlap_p2p", lambda cfg: overlap)
    cfg = tiny_config("gpt", (1, 4, 1), **{"parallel.schedule": "1f1b-phased"})
    jaxpr = _lowered(cfg, trace_only=True).jaxpr.jaxpr
    (body,) = _steady_pair_bodies(jaxpr)
    conds = [e for e in body.eqns if e.primitive.name == "cond"]
    first_permute = next(e for e in body.eqns if e.primitive.name == "ppermute")
    derived = set(first_permute.outvars)
    for eqn in body.eqns[body.eqns.index(first_permute) + 1:]:
        if eqn is conds[1]:
            break
        if any(not hasattr(v, "val") and v in derived for v in eqn.invars):
            derived |= set(eqn.outvars)
    feeds_switch = any(not hasattr(v, "val") and v in derived for v in conds[1].invars)
    assert feeds_switch != overlap


def test_overlap_p2p_changes_no_bit(monkeypatch):
    """Filing the forward message later moves a write between slots the backward row does not
    touch: the loss and gradients are the same bit for bit as with the rule patched off."""
    cfg = tiny_config("gpt", (2, 2, 2), **{"parallel.schedule": "zb-phased",
                                            "parallel.virtual_stages": 2})
    on = loss_and_grads(cfg)
    monkeypatch.setattr(D, "overlap_p2p", lambda cfg: False)
    off = loss_and_grads(cfg)
    assert on[0] == off[0]
    for a, b in zip(jax.tree.leaves(on[1]), jax.tree.leaves(off[1])):
        np.testing.assert_array_equal(a, b)


def test_overlap_p2p_rule_is_the_phased_schedules_with_a_pipeline():
    for schedule, pipe, on in (("1f1b-phased", 2, True), ("zb-phased", 4, True),
                               ("1f1b", 2, False), ("zb-v", 2, False), ("zb-phased", 1, False)):
        extra = {"parallel.virtual_stages": 2} if schedule == "zb-v" else {}
        cfg = tiny_config("gpt", (1, pipe, 1), **{"parallel.schedule": schedule}, **extra)
        assert D.overlap_p2p(cfg) is on


def test_empty_buffers_rule_is_tensor_one():
    """decisions.empty_buffers: uninitialised buffers where 'tensor' is 1, zeros with tensor
    parallelism (test_gpu_lowering_allocates_without_filling checks both lowerings)."""
    assert D.empty_buffers(tiny_config("gpt", (1, 2, 1), **{"parallel.schedule": "zb-phased"}))
    assert not D.empty_buffers(tiny_config("gpt", (1, 2, 2), **{"parallel.schedule": "zb-phased"}))
