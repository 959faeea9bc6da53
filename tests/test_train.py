"""The API and CLI end to end: losses fall, layouts reproduce each other, the
result's parameters are canonical, metrics reach JSONL and TensorBoard."""
import json

import jax
import numpy as np
import pytest

from ptdp_jax import train
from ptdp_jax.cli.train import main as cli_main
from ptdp_jax.models.model import param_shapes

TINY = {"model.num_layers": 4, "model.hidden_size": 32, "model.num_heads": 4,
        "model.seq_len": 32, "train.global_batch_size": 8, "train.micro_batch_size": 2,
        "train.steps": 3, "train.eval_every": 0, "train.sample_tokens": 0}


def run(tmp_path, mesh, **extra):
    return train(mesh_shape=mesh, overrides={**TINY, "run.dir": str(tmp_path / "run"), **extra},
                 log=lambda *a, **k: None)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return run(tmp_path_factory.mktemp("single"), (1, 1, 1))


def test_loss_falls_on_embedded_corpus(tmp_path):
    res = run(tmp_path, (1, 1, 1), **{"train.steps": 40, "train.lr": 1e-2, "train.warmup_steps": 5,
                                      "train.eval_every": 40})
    assert len(res.losses) == 40
    assert np.mean(res.losses[-5:]) < res.losses[0] - 1.5, res.losses
    assert res.val_losses and res.val_losses[-1][0] == 40
    assert res.val_losses[-1][1] < res.losses[0] - 1.0


@pytest.mark.parametrize("mesh,extra", [
    ((2, 1, 4), {}),
    ((2, 2, 2), {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
    ((1, 4, 2), {"parallel.schedule": "1f1b", "train.micro_batch_size": 1}),
    ((2, 1, 4), {"parallel.sequence_parallel": True}),
], ids=["2x1x4", "2x2x2-interleaved", "1x4x2-1f1b", "2x1x4-sequence-parallel"])
def test_layouts_reproduce_single_device_run(tmp_path, single, mesh, extra):
    res = run(tmp_path, mesh, **extra)
    np.testing.assert_allclose(res.losses, single.losses, rtol=1e-5)
    flat = lambda r: np.concatenate([np.ravel(x) for x in jax.tree.leaves(r.params)])
    # atol: Adam turns float rounding in gradients that are zero in exact arithmetic (the key
    # bias: softmax ignores it) or nearly so into updates of up to lr; the 3 steps run at
    # lr/20, 2lr/20, 3lr/20 (the first step does not run at lr = 0): up to ~3e-6 here.
    np.testing.assert_allclose(flat(res), flat(single), rtol=1e-4, atol=5e-6)


def test_result_params_are_canonical_numpy(single):
    shapes = param_shapes(single.config.model)
    got = jax.tree.map(lambda a: a.shape, single.params)
    assert got == shapes
    assert all(isinstance(a, np.ndarray) for a in jax.tree.leaves(single.params))
    assert single.params["layers"]["q_w"].shape[0] == 4          # (L, ...)


def test_dropout_is_layout_independent(tmp_path):
    extra = {"model.dropout": 0.1, "train.steps": 2}
    a = run(tmp_path / "a", (1, 1, 1), **extra)
    b = run(tmp_path / "b", (2, 2, 1), **extra, **{"parallel.schedule": "1f1b"})
    np.testing.assert_allclose(a.losses, b.losses, rtol=1e-5)
    c = run(tmp_path / "c", (1, 1, 1), **{**extra, "model.dropout": 0.0})
    assert abs(a.losses[0] - c.losses[0]) > 1e-4        # dropout really acts


def test_cli_trains_writes_metrics_and_samples(tmp_path, capsys):
    args = [f"{k}={v}" for k, v in TINY.items()]
    rc = cli_main(["--mesh", "1,2,1", *args, f"run.dir={tmp_path / 'cli'}",
                   "train.sample_tokens=20", "train.eval_every=3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "mesh (data, pipe, tensor) = (1, 2, 1)" in out and "--- sample (temperature 0.6, top-k 20) ---" in out
    assert out.index("compiling the train step") < out.index("compiled in") < out.index("mesh (")
    lines = [json.loads(l) for l in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_device", "step_time_s"):
        assert all(np.isfinite(l[key]) for l in lines), key
    assert "val_loss" in lines[-1]
    assert list((tmp_path / "cli").glob("events.out.tfevents.*"))


def test_cli_reports_config_errors(capsys):
    assert cli_main(["--mesh", "1,3,1", "model.num_layers=4"]) == 2
    err = capsys.readouterr().err
    assert "model.num_layers=4" in err and "3 x 1 = 3" in err
    assert cli_main(["model.nope=1"]) == 2
    assert cli_main(["--mesh", "1,2", "train.steps=1"]) == 2
