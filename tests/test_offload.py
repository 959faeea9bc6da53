"""Activation offload (train.recompute=offload): selective recomputation's residuals kept in the
host's pinned memory between the forward and the backward, without pipelining. Loss and
gradients equal one device's on each kind of layout (float32, parity.py's tolerance), and the
step moves them to the host (a device_put to host memory in its program)."""
import jax
import pytest

from jaxprs import equations
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


def test_not_with_pipelining():
    from ptdp_jax.config.load import ConfigError
    with pytest.raises(ConfigError, match=r"train.recompute=offload .*parallel.pipe=2"):
        tiny_config("gpt", (1, 2, 1), **OFFLOAD)


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
