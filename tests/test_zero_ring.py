"""parallel.zero_ring: ZeRO's weight gathers and gradient reduce-scatters over 'data' as rings of
permutes (zero.ring_gather, zero.ring_reduce_scatter), which XLA's peer mode runs on the copy
engines. Loss and gradients equal the one-device model's on every layout ZeRO runs on (the
size threshold set to 0, so the tiny model's tensors take the ring); the compiled step holds
permutes instead of NCCL's gathers and reduce-scatters, and keeps NCCL's for shards under the
threshold; the setting's resolution, compiler option and refusals."""
import re

import jax
import numpy as np
import pytest

from parity import assert_close, loss_and_grads, reference, tiny_config
from test_tp_overlap_auto import fake_mesh
from ptdp_jax import zero as Z
from ptdp_jax.config import ConfigError, load_config
from ptdp_jax.sharding import zero_ring_on
from ptdp_jax.step import PERMUTE_PEER_MODE, compiler_options
from ptdp_jax.validation import validate

RING = {"parallel.zero_ring": True}
F1 = {"parallel.schedule": "1f1b", "train.micro_batch_size": 2}
SP = {"parallel.sequence_parallel": True, "parallel.tp_comm_overlap": True,
      "train.micro_batch_size": 4}                               # (2,1,2): m = 1, the TP ring too

CASES = [
    ("gpt", (8, 1, 1), 2, {}),                                   # m = 1, d = 8
    ("llama", (4, 1, 2), 1, {}),                                 # m = 2, tensor 2
    ("gpt", (4, 1, 2), 3, {"train.recompute": "selective",
                           "train.scan_layers": False}),         # each unrolled layer gathers
    ("llama", (8, 1, 1), 3, {}),                                 # rings inside the layer scan
    ("llama", (2, 2, 2), 2, F1),                                 # p > 1: stage weights, d = 2
    ("gpt", (2, 1, 2), 2, SP),                                   # both rings, both on 'data' / 'tensor'
]


@pytest.fixture
def ring_everything(monkeypatch):
    monkeypatch.setattr(Z, "RING_MIN_BYTES", 0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-zero{c[2]}")
def test_parity(case, ring_everything):
    arch, mesh, zero, o = case
    cfg = tiny_config(arch, mesh, **{"parallel.zero": zero, **RING, **o})
    assert_close(loss_and_grads(cfg), reference(arch))


def test_parity_bfloat16_reduction(ring_everything):
    """The ring adds the partial sums in bfloat16 at each hop, as NCCL's bfloat16 reduction:
    held to the bfloat16 reduction's own 1e-2 (test_zero.test_bfloat16_gradient_reduction)."""
    cfg = tiny_config("gpt", (4, 1, 1), **{"parallel.zero": 2, **RING,
                                           "parallel.grad_reduce_dtype": "bfloat16"})
    assert_close(loss_and_grads(cfg), reference("gpt"), atol_frac=1e-2)


def _collectives(cfg):
    from ptdp_jax.sharding import make_mesh
    from ptdp_jax import step
    from parity import batch_for
    from ptdp_jax import state as S
    mesh = make_mesh(cfg.parallel.mesh_shape)
    tx, _ = S.make_optimizer(cfg)
    params = jax.jit(lambda: S.init_state(cfg, tx)["params"])()
    hlo = jax.jit(step.make_grad_fn(cfg, mesh)).lower(params, batch_for(cfg), 0).as_text()
    ops = ("all-gather", "reduce-scatter", "collective-permute", "all-reduce")
    return {op: len(re.findall(rf"= \S+ {op}\(|stablehlo\.{op.replace('-', '_')}", hlo))
            for op in ops}


def test_hlo_permutes_instead_of_gathers(ring_everything):
    """(4,1,1) zero 2, m = 1: with the ring every gather and reduce-scatter over 'data' is a
    chain of 3 permutes; without, none."""
    base = {"parallel.zero": 2}
    off = _collectives(tiny_config("gpt", (4, 1, 1), **base))
    on = _collectives(tiny_config("gpt", (4, 1, 1), **base, **RING))
    assert off["collective-permute"] == 0 and off["all-gather"] > 0 and off["reduce-scatter"] > 0
    assert on["all-gather"] == 0 and on["reduce-scatter"] == 0
    assert on["collective-permute"] == 3 * (off["all-gather"] + off["reduce-scatter"])


def test_small_shards_keep_nccl():
    """Under RING_MIN_BYTES a shard (the tiny model's are a few KiB) keeps the collective."""
    on = _collectives(tiny_config("gpt", (4, 1, 1), **{"parallel.zero": 2, **RING}))
    assert on["collective-permute"] == 0 and on["all-gather"] > 0


def _cfg(**ov):
    return load_config(overrides={"parallel.data": 4, "parallel.zero": 2,
                                  "train.global_batch_size": 16, "train.micro_batch_size": 4,
                                  **ov})


def test_resolution_and_peer_mode():
    auto = _cfg(**{"parallel.zero_ring": "auto"})
    assert zero_ring_on(auto, fake_mesh((4, 1, 1)))
    assert not zero_ring_on(auto, fake_mesh((4, 1, 1), platform="cpu"))
    assert not zero_ring_on(auto, fake_mesh((4, 1, 1), processes=[0, 1, 2, 3]))
    # data across two hosts of 2 GPUs: (2,1,2) with each data group spanning them
    two = _cfg(**{"parallel.zero_ring": "auto", "parallel.data": 2, "parallel.tensor": 2,
                  "train.micro_batch_size": 8})
    assert not zero_ring_on(two, fake_mesh((2, 1, 2), processes=[0, 0, 1, 1]))
    assert zero_ring_on(two, fake_mesh((2, 1, 2), processes=[0, 1, 0, 1]))
    assert not zero_ring_on(_cfg(), fake_mesh((4, 1, 1)))                        # false
    assert not zero_ring_on(_cfg(**{"parallel.zero": 0, "parallel.zero_ring": "auto"}),
                            fake_mesh((4, 1, 1)))
    assert zero_ring_on(_cfg(**RING), fake_mesh((4, 1, 1), platform="cpu"))     # as given
    scan_tp = _cfg(**{"parallel.zero_ring": "auto", "parallel.zero": 3, "parallel.data": 2,
                      "parallel.tensor": 2, "train.micro_batch_size": 8})
    assert not zero_ring_on(scan_tp, fake_mesh((2, 1, 2)))        # layer scan with tensor > 1
    opts = compiler_options(_cfg(**RING), fake_mesh((4, 1, 1)))
    assert opts["xla_gpu_collective_permute_mode"] == PERMUTE_PEER_MODE
    assert "xla_gpu_collective_permute_mode" not in compiler_options(_cfg(), fake_mesh((4, 1, 1)))


@pytest.mark.parametrize("ov, msg", [
    ({"parallel.zero_ring": "ring"}, r"parallel.zero_ring must be true, false or auto, got 'ring'"),
    ({**RING, "parallel.zero": 0}, r"needs parallel.zero >= 1 and parallel.data > 1 \(got zero=0, data=4\)"),
    ({**RING, "parallel.zero": 3, "parallel.data": 2, "parallel.tensor": 2},
     r"zero_ring with parallel.tensor > 1 needs the layers unrolled \(got train.scan_layers=auto, "
     r"parallel.zero=3, tensor=2"),
])
def test_refused(ov, msg):
    with pytest.raises(ConfigError, match=msg):
        validate(_cfg(**ov))
