"""Activation offload (train.recompute=offload): selective recomputation's residuals kept in the
host's pinned memory between the forward and the backward; with pipelining in host buffers
that the executor's ticks fill and read (pipeline/host_stash.py). Loss and gradients equal one
device's on each kind of layout (float32, parity.py's tolerance), and the step moves them to
the host (a device_put to host memory in its program; no host buffer in a conditional)."""
import jax
import numpy as np
import pytest

from jaxprs import LOOPS, equations
from parity import assert_close, batch_for, loss_and_grads, reference, tiny_config
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.training import state as S
from ptdp_jax.training import step as step

OFFLOAD = {"train.recompute": "offload"}
LAYOUTS = [
    ("gpt", (1, 1, 1), {}),
    ("llama", (2, 1, 1), {"parallel.zero": 3}),                    # the layer scan
    ("gpt", (1, 1, 2), {"parallel.sequence_parallel": True}),
    ("llama", (1, 1, 1), {"parallel.context": 2}),
]
IDS = ["one-device", "zero3-scan", "tensor2-sp", "context2"]


@pytest.mark.parametrize("arch,mesh,extra", LAYOUTS, ids=IDS)
def test_offload_parity(arch, mesh, extra):
    assert_close(loss_and_grads(tiny_config(arch, mesh, **OFFLOAD, **extra)), reference(arch))


PIPELINES = [
    ("gpt", (1, 2, 1), {"parallel.schedule": "1f1b"}),                     # a static stash
    ("gpt", (1, 2, 1), {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2,
                        "tuning.static_stash": False}),                    # an indexed one
    ("llama", (1, 2, 1), {"parallel.schedule": "zb-phased",
                          "parallel.virtual_stages": 2}),                  # + the W stash
    ("llama", (1, 2, 2), {"parallel.schedule": "1f1b", "parallel.sequence_parallel": True}),
    ("llama", (1, 2, 1), {"parallel.schedule": "zb-phased", "parallel.context": 2}),
    ("gpt", (2, 2, 1), {"parallel.schedule": "1f1b", "parallel.zero": 1}),
]
PIPELINE_IDS = ["1f1b", "interleaved-indexed", "zb-phased-v2", "tensor2-sp", "context2-zb-phased",
                "data2-zero1"]


@pytest.mark.parametrize("arch,mesh,extra", PIPELINES, ids=PIPELINE_IDS)
def test_offload_pipeline_parity(arch, mesh, extra):
    cfg = tiny_config(arch, mesh, **OFFLOAD, **extra)
    assert_close(loss_and_grads(cfg), reference(arch))


def test_offload_pipeline_parity_fp8():
    from parity import assert_close_fp8
    fp8 = {"train.fp8": True}
    cfg = tiny_config("llama", (1, 2, 1), **OFFLOAD, **fp8, **{"parallel.schedule": "1f1b"})
    assert_close_fp8(loss_and_grads(cfg), reference("llama", tuple(fp8.items())),
                     reference("llama"))


def _grad_jaxpr(cfg):
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
    return jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0).jaxpr


@pytest.mark.parametrize("schedule", ["1f1b", "zb-phased"])
def test_the_pipeline_stash_is_in_host_memory_outside_conditionals(schedule):
    """The loops carry host buffers; no conditional (the tick's switch, the head's) takes one:
    XLA would compute on the host what it does to them."""
    from ptdp_jax.pipeline.host_stash import in_host_memory

    def host_operands(recompute):
        cfg = tiny_config("gpt", (1, 2, 1), **{"train.recompute": recompute,
                                               "parallel.schedule": schedule})
        eqns = [eqn for eqn, _ in equations(_grad_jaxpr(cfg))]
        count = lambda names: sum(in_host_memory(v.aval) for eqn in eqns
                                  if eqn.primitive.name in names for v in eqn.invars)
        return count(LOOPS), count(("cond",))
    assert host_operands("selective") == (0, 0)
    loops, conds = host_operands("offload")
    assert loops > 0 and conds == 0


def _simulate(name, p, m, v):
    """Play the host stash's columns as the executor does, per stage: every backward must read
    the leaves its own forward (same microbatch and chunk) left."""
    from ptdp_jax.pipeline import schedule as SC
    from ptdp_jax.pipeline.host_stash import READS, run_order, with_host_columns
    from ptdp_jax.pipeline.routing import control_table
    sched = SC.build_schedule(name, p, m, v)
    branches, table = control_table(sched, [2] * (p * v))
    table = with_host_columns(table, branches, run_order(sched))
    arr = sched.executor_arrays()
    reads = 0
    for s in range(p):
        host, pending, incoming = {}, None, None
        for r in run_order(sched):
            if table["host_store_slot"][r, s] >= 0:
                host[table["host_store_slot"][r, s]] = pending
            fetched = host.get(table["host_fetch_slot"][r, s])
            op, me = arr["op"][r, s], (arr["mb"][r, s], arr["vchunk"][r, s])
            if op == SC.FWD:
                pending = me
            elif op in READS:
                got = pending if table["host_forwarded"][r, s] else incoming
                assert got == me, (name, p, m, v, s, r, got, me)
                reads += 1
            incoming = fetched
    return reads


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 2, 4, 1), ("1f1b", 4, 8, 1),
                                        ("1f1b-phased", 4, 8, 1), ("interleaved", 2, 4, 2),
                                        ("zb-h1", 3, 6, 1), ("zb-v", 2, 4, 2),
                                        ("zb-phased", 4, 8, 2)])
def test_every_backward_reads_its_forwards_leaves(name, p, m, v):
    assert _simulate(name, p, m, v) >= p * m * v      # every chunk's backward read (or halves)


def test_host_leaves_moves_as_many_of_each_kind_as_the_offload_policy():
    from ptdp_jax.pipeline.host_stash import host_leaves
    dev, host = jax.memory.Space.Device, jax.memory.Space.Host
    aval = lambda shape, space: jax.core.ShapedArray(shape, np.float32, memory_space=space)
    kept = [aval((4, 8), dev), aval((4, 2), dev), aval((1, 4), dev), aval((4, 8), dev)]
    offloaded = [aval((4, 8), dev), aval((1, 4), host), aval((4, 2), host), aval((4, 8), host)]
    assert host_leaves(kept, offloaded) == (False, True, True, True)


@pytest.mark.parametrize("mesh", [(1, 1, 1), (2, 1, 2)], ids=["one-device", "data2-tensor2"])
def test_the_step_moves_residuals_to_the_host(mesh):
    def host_puts(recompute):
        cfg = tiny_config("gpt", mesh, **{"train.recompute": recompute})
        tx, _ = S.make_optimizer(cfg)
        params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
        grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
        jaxpr = jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0)
        return sum(1 for eqn, _ in equations(jaxpr.jaxpr) if eqn.primitive.name == "device_put"
                   and "Host" in str(eqn.params.get("devices")))
    assert host_puts("offload") > 0 and host_puts("selective") == 0


def test_the_pipeline_stash_leaves_the_device(monkeypatch):
    """The estimate keeps the layer inputs of each slot on the device and counts the rest in
    host memory; a host without room for it is refused before compiling, naming the keys."""
    from ptdp_jax.training import memory, preflight
    gpipe = {"parallel.schedule": "gpipe"}                 # every microbatch in flight
    cfg = tiny_config("gpt", (1, 2, 1), **OFFLOAD, **gpipe)
    selective = tiny_config("gpt", (1, 2, 1), **{"train.recompute": "selective"}, **gpipe)
    assert memory.stash_slots(cfg) > memory.TRANSIT_CHUNKS
    assert memory.activation_bytes(cfg) < memory.activation_bytes(selective)
    assert memory.host_stash_bytes(cfg) > 0 == memory.host_stash_bytes(selective)
    assert "pinned host memory" in memory.estimate_memory(cfg).describe()      # the dry run's
    assert "host" not in memory.estimate_memory(selective).describe()
    monkeypatch.setattr(preflight, "HOST_STASH_SHARE", 1e-12)
    with pytest.raises(preflight.MemoryCheckError, match=r"train.recompute=offload keeps .* "
                       r"slots of parallel.schedule=.* train.micro_batch_size"):
        preflight.check_memory(cfg)
