"""train.fp8: FP8 operands for the layers' GEMMs (models/fp8.py). The quantizer's contract,
the config's checks, and loss and gradients on every kind of layout against one device, within
parity.py's FP8 bound (its comment says why no elementwise bound holds on every CPU), which a
missed quantization fails (test_fp8_changes_the_numbers)."""
import warnings
from collections import Counter
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprs import equations
from parity import (assert_close_fp8, batch_for, fp8_cases, fp8_mismatches, loss_and_grads,
                    reference, tiny_config)
from ptdp_jax.config.load import ConfigError
from ptdp_jax.models import fp8 as F8
from ptdp_jax.config.validation import check_devices
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.training import state as S
from ptdp_jax.training import step

FP8 = (("train.fp8", True),)


def test_scale_is_the_least_power_of_two_that_fits():
    x = jnp.array([0.5, -3.0, 100.0], jnp.float32)
    s = float(F8.scale_of(x, F8.E4M3))
    assert s == 0.25                       # 100 / 448 = 0.223 -> 0.25
    assert float(F8.scale_of(jnp.array([448.0]), F8.E4M3)) == 1.0     # exactly the largest
    assert float(F8.scale_of(jnp.zeros(3), F8.E4M3)) == 1.0
    assert float(F8.scale_of(jnp.array([57344.0 * 4]), F8.E5M2)) == 4.0


def test_powers_of_two_by_their_bits():
    """The bit-level scale math against numpy's frexp and ldexp over normal float32 values."""
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0x00800000, 0x7F000000, 20000),
                           np.arange(1, 254) << 23, (np.arange(1, 254) << 23) + 1,
                           (np.arange(2, 254) << 23) - 1]).astype(np.int32)
    r = bits.view(np.float32)
    mant, exp = np.frexp(r)
    want = np.ldexp(np.float32(1.0), np.where(mant == 0.5, exp - 1, exp)).astype(np.float32)
    got = np.asarray(jax.jit(F8.power_of_two_above)(r))
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    assert float(F8.power_of_two_above(0.0)) == 1.0
    e = np.arange(-126, 128)
    p = np.asarray(jax.jit(F8.two_to)(e))
    np.testing.assert_array_equal(p, np.ldexp(np.float32(1.0), e).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(jax.jit(F8.exponent)(p)), e)
    s = F8.scale_of_amax(jnp.array([np.inf, np.nan], jnp.float32), F8.E4M3)
    assert np.isinf(s[0]) and np.isnan(s[1])               # a bad step stays visible


def test_qdq_rounds_to_the_grid_and_is_idempotent():
    x = jax.random.normal(jax.random.key(0), (64, 32)) * 7.0
    for fmt in (F8.E4M3, F8.E5M2):
        y = F8.qdq(x, fmt)
        s = F8.scale_of(x, fmt)
        assert jnp.all((y / s).astype(fmt).astype(jnp.float32) == y / s)   # on the grid
        np.testing.assert_array_equal(F8.qdq(y, fmt), y)                   # idempotent
        assert float(jnp.abs(y - x).max()) <= float(jnp.abs(x).max()) * 2.0 ** -2
    bf = x.astype(jnp.bfloat16)
    assert F8.qdq(bf, F8.E4M3).dtype == jnp.bfloat16


def test_fp8_einsum_gradients_are_those_of_the_rounded_operands():
    """Forward on E4M3 x and w; backward with dy rounded to E5M2."""
    kx, kw, kg = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (2, 8, 16))
    w = jax.random.normal(kw, (16, 4, 8))
    g = jax.random.normal(kg, (2, 8, 4, 8))
    spec = "bsh,hnd->bsnd"
    y, pull = jax.vjp(lambda a, b: F8.einsum(spec, a, b), x, w)
    xq, wq, gq = F8.qdq(x, F8.E4M3), F8.qdq(w, F8.E4M3), F8.qdq(g, F8.E5M2)
    np.testing.assert_allclose(y, jnp.einsum(spec, xq, wq), rtol=1e-6)
    dx, dw = pull(g)
    np.testing.assert_allclose(dx, jnp.einsum("bsnd,hnd->bsh", gq, wq), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, jnp.einsum("bsh,bsnd->hnd", xq, gq), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_fp8_changes_the_numbers(arch):
    """The reference the layouts are held to is FP8's own: against float32 its loss is close,
    and a run that did not quantize (float32's) fails the parity bound on every layer weight."""
    (l8, g8), (l32, g32) = reference(arch, FP8), reference(arch)
    assert abs(l8 - l32) < 1e-2 * abs(l32)
    bad = fp8_mismatches((l32, g32), (l8, g8), (l32, g32))
    weights = [k for k in g8["layers"] if k.endswith("_w") or k.startswith("w")]   # the GEMMs
    assert all(any(f"['layers']['{k}']" in b for b in bad) for k in weights), bad


@pytest.mark.parametrize("arch,mesh,extra", fp8_cases("gpt")[0], ids=fp8_cases("gpt")[1])
def test_fp8_parity(arch, mesh, extra):
    got = loss_and_grads(tiny_config(arch, mesh, **dict(FP8), **extra))
    assert_close_fp8(got, reference(arch, FP8), reference(arch))


@pytest.mark.parametrize("arch,mesh,extra", [
    ("llama", (1, 1, 2), {"train.recompute": "selective"}),
    ("gpt", (1, 1, 4), {"train.recompute": "full", "train.micro_batch_size": 4}),
    ("gpt", (2, 1, 2), {"train.recompute": "selective", "parallel.zero": 2})],
    ids=["llama-1x1x2-selective", "gpt-1x1x4-full-rows", "gpt-2x1x2-zero2-selective"])
def test_fp8_ring_parity_under_recomputation(arch, mesh, extra):
    """The tensor ring's FP8 GEMMs recomputed (their residuals are their inputs) give one
    device's FP8 numbers."""
    ring = {"parallel.sequence_parallel": True, "tuning.tp_comm_overlap": True}
    got = loss_and_grads(tiny_config(arch, mesh, **dict(FP8), **ring, **extra))
    assert_close_fp8(got, reference(arch, FP8), reference(arch))


def _permuted_dtypes(cfg) -> Counter:
    params = jax.eval_shape(lambda: S.init_state(cfg, S.make_optimizer(cfg)[0])["params"])
    grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
    jaxpr = jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0).jaxpr
    return Counter(str(v.aval.dtype) for eqn, _ in equations(jaxpr)
                   if eqn.primitive.name == "ppermute" for v in eqn.invars)


@pytest.mark.parametrize("arch,t", [("gpt", 2), ("llama", 4)])
def test_the_tensor_ring_moves_fp8_bytes(arch, t):
    """With tuning.tp_comm_overlap a layer runs ten rings of t - 1 permutes; under FP8 six of
    them carry FP8 bytes (x forward and again backward for the two column-parallel rings, dy
    of the two row-parallel ones), one block for all the GEMMs that read x (QKV; gate and up);
    the four of partial sums stay in the compute dtype. auto leaves the ring off under FP8."""
    L, ring = 2, {"parallel.sequence_parallel": True, "tuning.tp_comm_overlap": True,
                  "model.num_layers": 2, "train.micro_batch_size": 8}
    plain = _permuted_dtypes(tiny_config(arch, (1, 1, t), **ring))
    fp8 = _permuted_dtypes(tiny_config(arch, (1, 1, t), **ring, **dict(FP8)))
    assert plain == {"float32": 10 * L * (t - 1)}, plain
    assert fp8 == {"uint8": 6 * L * (t - 1), "float32": 4 * L * (t - 1)}, fp8
    cfg = tiny_config("gpt", (1, 1, 2), **{"train.fp8": True, "parallel.sequence_parallel": True,
                                           "train.global_batch_size": 1})
    assert not cfg.tp_comm_overlap_on


def test_fp8_devices():
    cfg = tiny_config("gpt", (1, 1, 1), **dict(FP8))
    a100 = SimpleNamespace(platform="gpu", compute_capability="8.0", device_kind="NVIDIA A100")
    with pytest.raises(ConfigError, match="NVIDIA A100 has 8.0"):
        check_devices(cfg, [a100])
    check_devices(cfg, [SimpleNamespace(platform="gpu", compute_capability="9.0",
                                            device_kind="NVIDIA H200")])
    with pytest.warns(UserWarning, match="emulated"):
        check_devices(cfg, jax.devices())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_devices(tiny_config("gpt", (1, 1, 1)), jax.devices())   # fp8 off: silent


PLAN_CASES = [   # (config, overrides, measured bf16 s, measured FP8 s): 1x H200, 2026-11-28
    ("configs/llama-7b.yaml", {"model.num_layers": 8, "train.global_batch_size": 8,
                               "train.micro_batch_size": 8, "train.recompute": "selective"},
     0.3135, 0.2293),
    ("configs/llama-7b.yaml", {"model.num_layers": 8, "train.global_batch_size": 8,
                               "train.micro_batch_size": 8, "train.recompute": "none"},
     0.3110, 0.2271),
    ("configs/bench-1.3b.yaml", {"train.micro_batch_size": 16, "train.recompute": "none"},
     0.4977, 0.4058),
]


@pytest.mark.parametrize("path,over,bf16_s,fp8_s", PLAN_CASES)
def test_planner_prices_fp8(path, over, bf16_s, fp8_s):
    """The planner's FP8 step within 5% of the measured one, and faster than its bf16 step."""
    from ptdp_jax.config.load import load_config
    from ptdp_jax.plan.estimate import estimate_step
    base = {"parallel.data": 1, "parallel.pipe": 1, "parallel.tensor": 1, **over}
    from ptdp_jax.plan.hardware import gpu_kind
    est = lambda **o: estimate_step(load_config(path, overrides={**base, **o}), gpu_kind("h200"),
                                    8)
    fp8 = est(**{"train.fp8": True}).step_time_s
    assert abs(fp8 / fp8_s - 1) < 0.05
    assert fp8 < 0.85 * est().step_time_s


def test_auto_layout_keeps_fp8():
    """parallel.layout=auto plans with FP8 when it is asked for, and keeps it."""
    from ptdp_jax.config.load import load_config
    from ptdp_jax.plan.search import layout_config, plan
    cfg = load_config("configs/bench-1.3b.yaml", overrides={"train.fp8": True})
    best = plan(cfg, 2, "h200")[0]
    assert layout_config(cfg, best).train.fp8
    bf16_best = plan(load_config("configs/bench-1.3b.yaml"), 2, "h200")[0]
    assert best.estimate.step_time_s < bf16_best.estimate.step_time_s


def test_fp8_resume_is_bit_identical(tmp_path, data_cache):
    """FP8 keeps no state between steps (current scaling): 6 steps in one go == 3, stop, 3
    resumed, losses and parameters exactly equal."""
    import helpers_ckpt as H
    H.assert_resume_exact(H.tiny(tmp_path, data_cache, **{
        "train.steps": 6, "train.fp8": True, "checkpoint.every": 3}), (2, 1, 2))


def _e4m3_rounding_depths(jaxpr, shapes):
    """[loop depth] of each rounding to E4M3 of an array shaped like a GEMM weight (a shape in
    `shapes`)."""
    return [depth for eqn, depth in equations(jaxpr)
            if eqn.primitive.name == "convert_element_type"
            and eqn.params["new_dtype"] == F8.E4M3 and tuple(eqn.invars[0].aval.shape) in shapes]


@pytest.mark.parametrize("mesh,extra", [
    ((1, 1, 1), {}), ((2, 1, 1), {"parallel.zero": 1}), ((2, 1, 1), {"parallel.zero": 2}),
    ((1, 2, 1), {"parallel.schedule": "zb-phased"})], ids=["one", "zero1", "zero2", "zb-phased"])
def test_weights_are_rounded_once_a_step(mesh, extra):
    """Each GEMM weight is rounded to FP8 once a step, before the loop over microbatches (or
    pipeline ticks), not in each microbatch's forward and recomputation; so is its transposed
    copy for the forward GEMMs."""
    from ptdp_jax.models import model as M
    cfg = tiny_config("llama", mesh, **dict(FP8), **{"train.recompute": "selective"}, **extra)
    assert cfg.num_microbatches > 1
    params = jax.eval_shape(lambda: S.init_state(cfg, S.make_optimizer(cfg)[0])["params"])
    dense = M.dense_weight_names(cfg.model)
    shapes = {tuple(a.shape[3:]) for k, a in params["layers"].items() if k in dense}
    grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
    jaxpr = jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0).jaxpr
    depths = _e4m3_rounding_depths(jaxpr, shapes)
    layers_per_stage = cfg.model.num_layers // cfg.parallel.pipe
    assert depths == [0] * (layers_per_stage * len(dense)), depths
    transposes = [depth for eqn, depth in equations(jaxpr) if eqn.primitive.name == "transpose"
                  and eqn.invars[0].aval.dtype == F8.E4M3
                  and tuple(eqn.invars[0].aval.shape) in shapes]
    assert transposes == [0] * (layers_per_stage * len(dense)), transposes


def test_forward_reads_the_transposed_weight():
    """A prequantized weight's forward GEMM gives the numbers of the weight as it is."""
    kx, kw = jax.random.split(jax.random.key(2))
    x = jax.random.normal(kx, (2, 8, 4, 8))
    w = jax.random.normal(kw, (4, 8, 16))
    spec = "bsnd,ndh->bsh"
    pre = F8.prequantize(w, spec)
    assert pre.qt.shape == (16, 4, 8)
    np.testing.assert_array_equal(F8.einsum(spec, x, pre), F8.einsum(spec, x, w))


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_taps_export_the_operands_of_the_whole_backward(recipe):
    """A zero-bubble B's taps export x and dy as the backward's FP8 operands (as fp8.residual
    keeps them on this backend), and W's weight gradient from them is the whole backward's."""
    from ptdp_jax.models import dense as D
    kx, kw, kg = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(kx, (2, 8, 16))
    w = jax.random.normal(kw, (16, 24)) * 0.1
    g = jax.random.normal(kg, (2, 8, 24)) * 1e-3
    spec = "bsh,hf->bsf"
    meta = jnp.zeros((2, F8.NBINS)).at[:, -F8.E_MIN - 2].set(1.0)    # history scales 2^-2
    structs = D.tap_structs(x.shape, g.shape, jnp.float32, fp8=True)
    for wf in (w, F8.prequantize(w, spec)):
        def form(inner):
            return inner if recipe == "current" else D.WithMeta(inner, meta)
        taps = D.Taps(wf, *jax.tree.map(lambda sd: jnp.zeros(sd.shape, sd.dtype), structs))
        _, pull = jax.vjp(lambda t: D.dense(spec, x, form(t), fp8=True), taps)
        (ct,) = pull(g)
        got = (ct.x_tap, ct.g_tap)
        assert jax.tree.map(lambda a: (a.shape, a.dtype), got) == \
            jax.tree.map(lambda sd: (sd.shape, sd.dtype), structs)
        dw = jax.grad(lambda m: jnp.vdot(D.dense(spec, x, form(D.MasterGrad(wf, m)), fp8=True),
                                         g))(w)
        np.testing.assert_array_equal(D.weight_grad(*got, dtype=jnp.float32), dw)


def test_the_w_stash_keeps_one_byte_an_element(monkeypatch):
    """On a GPU the W stash entry of a GEMM is its FP8 x and dy with their scales, and the
    memory estimate counts one byte an element for it."""
    from ptdp_jax.models import dense as D
    from ptdp_jax.training.memory import wstash_bytes
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    (x, sx), (g, sg) = D.tap_structs((2, 8, 16), (2, 8, 24), jnp.bfloat16, fp8=True)
    assert (x.dtype, g.dtype, sx.shape, sg.dtype) == (F8.E4M3, F8.E5M2, (), jnp.float32)
    zb = {"parallel.schedule": "zb-phased"}
    cfg = tiny_config("llama", (1, 2, 1), **zb)
    cfg8 = tiny_config("llama", (1, 2, 1), **zb, **dict(FP8))
    per_element = 4 if cfg.compute_dtype == "float32" else 2
    assert wstash_bytes(cfg8) * per_element == wstash_bytes(cfg) > 0
