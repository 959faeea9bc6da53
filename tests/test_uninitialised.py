"""The executor's buffers that the schedule writes before it reads them (stash, W stash,
receive and send buffers) start uninitialised (`executor.empty_buffer`: XLA's AllocateBuffer
on GPU, no fill and no copy into the loop). Here they start as NaN: any read of a slot before
its write, or any idle stage's garbage reaching a sum, would turn the loss or a gradient into
NaN. The loss and every gradient must come out bit for bit as with zeros (CPU: `lax.empty`
is zeros), on pure and mixed meshes, for every executor path (ticks, phased loops, static and
indexed stash, W stash, ZB-V's turn, the head over the pipe with and without its
conditional)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from parity import loss_and_grads, tiny_config
from ptdp_jax.pipeline import executor

CASES = [
    ("gpt", (1, 4, 1), {"parallel.schedule": "1f1b"}),
    ("gpt", (2, 2, 2), {"parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2}),
    ("llama", (1, 2, 2), {"parallel.schedule": "zb-phased", "parallel.virtual_stages": 2,
                          "parallel.static_stash": False}),
    ("gpt", (2, 4, 1), {"parallel.schedule": "zb-phased", "train.recompute": "selective"}),
    ("gpt", (1, 2, 1), {"parallel.schedule": "zb-v", "parallel.virtual_stages": 2}),
]


@pytest.mark.parametrize("arch,mesh,extra", CASES,
                         ids=["1f1b-141", "phased-v2-222", "zb-phased-v2-dyn-122-llama",
                              "zb-phased-241-sel", "zb-v-121"])
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
    call, which XLA neither fills nor copies into the loop (zeros were one broadcast copied
    into every buffer: 167 `copy(broadcast)` in session 17's GPU HLO); for CPU it is zeros."""
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
