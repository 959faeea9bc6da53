"""Shared helpers for parity tests: loss and gradients of one global batch on a
mesh, in canonical layout, compared against the single-device model."""
from __future__ import annotations

import functools

import jax
import numpy as np

from ptdp_jax.config.load import load_config
from ptdp_jax.config.validation import validate
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.training import state as S
from ptdp_jax.training import step as step
TINY = {
    "model.num_heads": 8, "model.hidden_size": 32, "model.seq_len": 16, "model.num_layers": 8,
    "train.global_batch_size": 8, "train.micro_batch_size": 1,
}


# FP8's layouts: one of each kind (tests/test_fp8.py, tests/test_fp8_delayed.py)
FP8_LAYOUTS = [
    ((2, 1, 1), {}),
    ((2, 1, 1), {"parallel.zero": 1}),
    ((2, 1, 1), {"parallel.zero": 2}),
    ((2, 1, 1), {"parallel.zero": 3}),
    ((1, 1, 2), {"parallel.sequence_parallel": True}),
    ((1, 2, 1), {"parallel.schedule": "zb-phased"}),
    ((1, 2, 1), {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
    ((2, 2, 2), {"parallel.sequence_parallel": True}),
    ((1, 1, 2), {"parallel.sequence_parallel": True, "tuning.tp_comm_overlap": True,
                 "train.micro_batch_size": 2}),                       # the ring, rows split
    ((2, 1, 2), {"parallel.sequence_parallel": True, "tuning.tp_comm_overlap": True,
                 "parallel.zero": 1}),                                # the ring, sequence split
]
FP8_LAYOUT_IDS = ["data2", "zero1", "zero2", "zero3", "tensor2-sp", "zb-phased", "interleaved",
                  "2x2x2-sp", "tensor2-ring", "2x1x2-ring-zero1"]


def fp8_cases(first: str):
    """(arch, mesh, overrides) of each FP8 layout and their ids: the models alternate, `first`
    on the first layout; the two recipes' tests start with different models, so that each
    layout meets both models once (the FP8 code of a layout is one for both recipes)."""
    other = {"gpt": "llama", "llama": "gpt"}
    archs = [first if i % 2 == 0 else other[first] for i in range(len(FP8_LAYOUTS))]
    return ([(a, mesh, extra) for a, (mesh, extra) in zip(archs, FP8_LAYOUTS)],
            [f"{name}-{a}" for a, name in zip(archs, FP8_LAYOUT_IDS)])


def tiny_config(arch="gpt", mesh=(1, 1, 1), **extra):
    o = {k: v for k, v in TINY.items() if v is not None}
    o.update({"model.arch": arch, "parallel.data": mesh[0], "parallel.pipe": mesh[1],
              "parallel.tensor": mesh[2]})
    if arch == "llama":
        o["model.ffn_hidden_size"] = 96
    o.update(extra)
    return validate(load_config(overrides=o), len(jax.devices()))


def batch_for(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.model.vocab_size,
                        (cfg.train.global_batch_size, cfg.model.seq_len + 1)).astype(np.int32)


def loss_and_grads(cfg, seed=0, batch=None):
    mesh = make_mesh(cfg.parallel.mesh_dims)
    tx, _ = S.make_optimizer(cfg)
    params = jax.jit(lambda: S.init_state(cfg, tx)["params"])()
    batch = batch_for(cfg, seed) if batch is None else batch
    loss, grads = jax.jit(step.make_grad_fn(cfg, mesh))(params, batch, 0)
    grads = jax.jit(lambda g: S.canonical_params(cfg, g))(grads)
    return float(loss), jax.tree.map(np.asarray, grads)


@functools.lru_cache(maxsize=None)
def reference(arch: str, num_microbatch_key: tuple = ()):
    """(1,1,1) loss and gradients for the tiny model (cached per arch and extra keys)."""
    return loss_and_grads(tiny_config(arch, (1, 1, 1), **dict(num_microbatch_key)))


def _joint_qkv_bias(grads):
    """GPT's q, k, v bias gradients compared as one tensor (as the fused QKV bias was): the key
    bias's gradient is zero in exact arithmetic (softmax ignores a shift common to every key),
    so alone it holds only rounding noise, and its relative error measures nothing."""
    layers = grads.get("layers", {}) if isinstance(grads, dict) else {}
    if not {"q_b", "k_b", "v_b"} <= set(layers):
        return grads
    layers = dict(layers)
    layers["qkv_b"] = np.stack([layers.pop(f"{c}_b") for c in "qkv"], -3)
    return {**grads, "layers": layers}


def assert_close(got, ref, rtol=2e-5, atol_frac=2e-5):
    (l1, g1), (l0, g0) = got, ref
    g1, g0 = _joint_qkv_bias(g1), _joint_qkv_bias(g0)
    np.testing.assert_allclose(l1, l0, rtol=rtol)
    flat1, tree1 = jax.tree.flatten_with_path(g1)
    flat0, _ = jax.tree.flatten_with_path(g0)
    assert len(flat1) == len(flat0)
    for (path, a), (_, b) in zip(flat1, flat0):
        scale = float(np.abs(b).max()) + 1e-12
        err = float(np.abs(a - b).max()) / scale
        assert err < atol_frac, f"gradient {jax.tree_util.keystr(path)}: rel. error {err:.2e}"


# FP8 (tests/test_fp8.py, tests/test_fp8_delayed.py). A layout whose float32 sums associate
# differently from one device's (a row-parallel GEMM's partial sums, another blocking of a
# GEMM on another CPU) can move a GEMM operand across an FP8 rounding boundary: an E5M2 element
# then moves by a quarter, and every gradient upstream of it moves. Which elements flip depends
# on the CPU, so no elementwise bound holds on every machine. What is exact is compared exactly
# (the loss; layouts that round as one device does land within FP8_TOL of its largest element);
# the rest is bounded by FP8's own effect on each gradient, which a layout that quantized
# wrongly or not at all reaches: measured on a 2-core AVX2 EPYC, 2026-12-01, the flips moved
# the tiny LLaMA's gradients by at most 0.13 of it (a last-bit perturbation of the weights moved
# them as far), a missed quantization moves them by all of it.
FP8_TOL = 5e-4
FP8_FRACTION = 1 / 3


def fp8_mismatches(got, ref, unquantized, fraction=FP8_FRACTION) -> list[str]:
    """The gradients of `got` outside the FP8 bound against `ref` (see above); `unquantized`:
    the same layout's float32 result, FP8's own effect."""
    (_, g1), (_, g0), (_, gf) = got, ref, unquantized
    g1, g0, gf = _joint_qkv_bias(g1), _joint_qkv_bias(g0), _joint_qkv_bias(gf)
    bad = []
    for (path, a), (_, b), (_, f) in zip(jax.tree.flatten_with_path(g1)[0],
                                         jax.tree.flatten_with_path(g0)[0],
                                         jax.tree.flatten_with_path(gf)[0]):
        if float(np.abs(a - b).max()) < FP8_TOL * (float(np.abs(b).max()) + 1e-12):
            continue                                      # rounded as one device rounds
        err, own = float(np.linalg.norm(a - b)), float(np.linalg.norm(f - b))
        if not err <= fraction * own:
            bad.append(f"gradient {jax.tree_util.keystr(path)}: moved {err / (own + 1e-30):.3f} "
                       f"of FP8's own effect (bound {fraction:.3f})")
    return bad


def assert_close_fp8(got, ref, unquantized):
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-5)
    bad = fp8_mismatches(got, ref, unquantized)
    assert not bad, "; ".join(bad)
