"""Activation offload (train.recompute=offload): selective recomputation's residuals kept in the
host's pinned memory between the forward and the backward; with pipelining the stash slots
that hold them are host buffers. Loss and gradients equal one device's on each kind of layout
(float32, parity.py's tolerance), and the step moves them to the host (a device_put to host
memory in its program; the pipeline loop carries host buffers)."""
import jax
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
    ("gpt", {"parallel.schedule": "1f1b"}),                                # a static stash
    ("gpt", {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2,
             "tuning.static_stash": False}),                               # an indexed one
    ("llama", {"parallel.schedule": "zb-phased", "parallel.virtual_stages": 2}),  # + W stash
]
PIPELINE_IDS = ["1f1b", "interleaved-indexed", "zb-phased-v2"]


@pytest.mark.parametrize("arch,extra", PIPELINES, ids=PIPELINE_IDS)
def test_offload_pipeline_parity(arch, extra):
    cfg = tiny_config(arch, (1, 2, 1), **OFFLOAD, **extra)
    assert_close(loss_and_grads(cfg), reference(arch))


def _grad_jaxpr(cfg):
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
    return jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0).jaxpr


@pytest.mark.parametrize("extra", [PIPELINES[0][1], PIPELINES[1][1]], ids=PIPELINE_IDS[:2])
def test_the_pipeline_stash_is_in_host_memory(extra):
    def host_carries(recompute):
        cfg = tiny_config("gpt", (1, 2, 1), **{"train.recompute": recompute}, **extra)
        loops = [eqn for eqn, _ in equations(_grad_jaxpr(cfg)) if eqn.primitive.name in LOOPS]
        return sum(in_host_memory(v.aval) for eqn in loops for v in eqn.invars)
    from ptdp_jax.pipeline.stash import in_host_memory
    layers = 2                          # tiny_config's layers on each of the 2 stages
    assert host_carries("offload") >= layers and host_carries("selective") == 0


@pytest.mark.parametrize("mesh", [(1, 1, 1), (2, 1, 2)], ids=["one-device", "data2-tensor2"])
def test_the_step_moves_residuals_to_the_host(mesh):
    def host_puts(recompute):
        cfg = tiny_config("gpt", mesh, **{"train.recompute": recompute})
        return sum(1 for eqn, _ in equations(_grad_jaxpr(cfg)) if eqn.primitive.name == "device_put"
                   and "Host" in str(eqn.params.get("devices")))
    assert host_puts("offload") > 0 and host_puts("selective") == 0


def test_the_pipeline_stash_leaves_the_device(monkeypatch):
    """The estimate keeps the layer inputs of each slot on the device and counts the rest in
    host memory; a host without room for it is refused before compiling, naming the keys."""
    from ptdp_jax.training import memory, preflight
    cfg = tiny_config("gpt", (1, 2, 1), **OFFLOAD)
    selective = tiny_config("gpt", (1, 2, 1), **{"train.recompute": "selective"})
    assert memory.activation_bytes(cfg) < memory.activation_bytes(selective)
    assert memory.host_stash_bytes(cfg) > 0 == memory.host_stash_bytes(selective)
    monkeypatch.setattr(preflight, "HOST_STASH_SHARE", 1e-12)
    with pytest.raises(preflight.MemoryCheckError, match=r"train.recompute=offload keeps .* "
                       r"slots of parallel.schedule=.* train.micro_batch_size"):
        preflight._check_host_stash(cfg)
