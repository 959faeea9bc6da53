from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from ptdp_jax.config.load import load_config
from ptdp_jax.training.metrics import (MetricsLogger, achieved_flops_per_device, layer_matmul_params,
                              mfu, model_flops_per_iteration, paper_flops_per_iteration,
                              paper_param_count, peak_flops_per_device, training_days,
                              transformer_flops_per_iteration)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def gpt(**kw):
    over = {"model.arch": "gpt"}
    over.update(kw)
    return load_config(None, over)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("name", ["gpt-1.7b.yaml", "gpt-145.6b.yaml", "gpt-1t.yaml",
                                  "gpt3-175b.yaml", "bench-1.3b.yaml", "demo.yaml"])
def test_generic_flops_equal_paper_formula_exactly(name, recompute):
    cfg = load_config(CONFIGS / name)
    m = cfg.model
    assert m.ffn == 4 * m.hidden_size
    exact = transformer_flops_per_iteration(cfg.train.global_batch_size, m.seq_len,
                                            m.num_layers, m.hidden_size, m.vocab_size,
                                            layer_matmul_params(m), recompute)
    paper = paper_flops_per_iteration(*map(Fraction, (cfg.train.global_batch_size, m.seq_len,
                                                      m.num_layers, m.hidden_size,
                                                      m.vocab_size)), recompute=recompute)
    assert paper == exact                                   # rational identity, no rounding
    assert model_flops_per_iteration(cfg, recompute) == pytest.approx(float(exact), rel=1e-15)
    assert model_flops_per_iteration(cfg, "full" if recompute else "none") == \
        model_flops_per_iteration(cfg, recompute)


def test_flops_small_by_hand():
    # B=2, s=4, l=1, h=2, V=3, GPT f=8: N_layer = 4*4 + 2*2*8 = 48
    cfg = gpt(**{"train.global_batch_size": 2, "model.seq_len": 4, "model.num_layers": 1,
                 "model.hidden_size": 2, "model.num_heads": 1, "model.vocab_size": 3})
    per_token = 3 * (2 * 48 + 4 * 4 * 2) + 3 * 2 * 2 * 3
    assert model_flops_per_iteration(cfg) == 2 * 4 * per_token
    per_token_rc = 4 * (2 * 48 + 4 * 4 * 2) + 3 * 2 * 2 * 3
    assert model_flops_per_iteration(cfg, recompute=True) == 2 * 4 * per_token_rc


def test_recompute_ratio_tends_to_4_over_3():
    cfg = load_config(CONFIGS / "gpt-1t.yaml")
    r = model_flops_per_iteration(cfg, True) / model_flops_per_iteration(cfg)
    assert 1.32 < r < 4 / 3


def test_llama_flops():
    cfg = load_config(CONFIGS / "llama-7b.yaml")
    m = cfg.model
    h, f, s, l, V = m.hidden_size, m.ffn, m.seq_len, m.num_layers, m.vocab_size
    assert f == 11008
    B = cfg.train.global_batch_size
    expect = B * s * (3 * l * (2 * (4 * h * h + 3 * h * f) + 4 * s * h) + 6 * h * V)
    assert model_flops_per_iteration(cfg) == expect
    # ~ 6 N tokens (+ attention): N ~ 6.7B
    n_matmul = l * (4 * h * h + 3 * h * f) + h * V
    ratio = model_flops_per_iteration(cfg) / (6 * n_matmul * B * s)
    assert 1.0 < ratio < 1.2


def test_paper_param_count():
    cfg = load_config(CONFIGS / "gpt3-175b.yaml")
    assert paper_param_count(cfg) / 1e9 == pytest.approx(174.6, abs=0.05)
    l, h, V, s = 96, 12288, 51200, 2048
    formula = 12 * l * h ** 2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert paper_param_count(cfg) == pytest.approx(formula, rel=1e-12)
    assert paper_param_count(cfg.model, vocab_size=V + 128) == paper_param_count(cfg) + 128 * h


def test_training_days_worked_examples():
    # the paper: 175B, 1024 GPUs, 140 TFLOP/s, 300B tokens -> ~34 days
    assert training_days(300e9, 175e9, 1024, 140e12) == pytest.approx(34, abs=0.5)
    # 1T (1008B), 3072 GPUs, 163 TFLOP/s, 450B tokens -> ~84 days
    assert training_days(450e9, 1008e9, 3072, 163e12) == pytest.approx(84, abs=0.5)
    assert training_days(1.0, 1.0, 1, 8.0 / 86400) == pytest.approx(1.0)


def test_peak_flops(monkeypatch):
    monkeypatch.delenv("PTDP_PEAK_TFLOPS", raising=False)

    class Dev:
        def __init__(self, kind):
            self.device_kind = kind

    assert peak_flops_per_device(Dev("NVIDIA H100 80GB HBM3")) == 989e12
    assert peak_flops_per_device("NVIDIA H200") == 989e12
    assert peak_flops_per_device("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_per_device("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_per_device(Dev("cpu")) is None
    assert peak_flops_per_device("TPU v9") is None
    assert peak_flops_per_device(None) is None
    monkeypatch.setenv("PTDP_PEAK_TFLOPS", "100")
    assert peak_flops_per_device(Dev("cpu")) == 100e12
    assert peak_flops_per_device("NVIDIA H100 80GB HBM3") == 100e12


def test_peak_flops_of_a_jax_device(monkeypatch):
    monkeypatch.delenv("PTDP_PEAK_TFLOPS", raising=False)
    import jax
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        assert peak_flops_per_device(dev) is None


def test_mfu():
    # 8 devices, 2 s per step, 1.6e16 FLOPs: 1e15 per device per s; peak 2e15 -> 50%
    assert achieved_flops_per_device(1.6e16, 2.0, 8) == pytest.approx(1e15)
    assert mfu(1.6e16, 2.0, 8, 2e15) == pytest.approx(0.5)
    assert mfu(1.6e16, 2.0, 8, None) is None
    assert mfu(1.6e16, 0.0, 8, 2e15) is None
    # the paper's 1T row: 163 TFLOP/s per GPU of 312 = 52% (with recomputation FLOPs)
    cfg = load_config(CONFIGS / "gpt-1t.yaml")
    F = model_flops_per_iteration(cfg, recompute=True)
    t = F / (3072 * 163e12)                       # the step time that gives 163 TFLOP/s
    assert mfu(F, t, 3072, 312e12) == pytest.approx(0.52, abs=0.005)


def test_metrics_logger(tmp_path):
    import numpy as np
    run = tmp_path / "run"
    with MetricsLogger(run) as log:
        log.log(1, {"loss": 3.5, "lr": 1e-3})
        log.log(2, {"loss": np.float32(3.25), "tokens": 4096, "note": "x"})
        # written and flushed line by line, before close
        lines = (run / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[0] == {"step": 1, "loss": 3.5, "lr": 1e-3}
    assert recs[1] == {"step": 2, "loss": 3.25, "tokens": 4096, "note": "x"}
    events = list(run.glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    # appending on reopen (resume)
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(3, {"loss": 3.0})
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert len(list(run.glob("events.out.tfevents.*"))) == 1


def test_metrics_logger_tensorboard_scalars(tmp_path):
    from tensorboardX.proto import event_pb2
    import struct
    with MetricsLogger(tmp_path) as log:
        log.log(5, {"loss": 2.0})
    (event_file,) = tmp_path.glob("events.out.tfevents.*")
    data = event_file.read_bytes()
    tags = []
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        ev = event_pb2.Event()
        ev.ParseFromString(data[pos + 12:pos + 12 + n])
        pos += 12 + n + 4
        for v in ev.summary.value:
            tags.append((ev.step, v.tag, v.simple_value))
    assert (5, "loss", 2.0) in tags


def test_tensorboard_warns_of_a_nan_once(tmp_path, caplog):
    """tensorboardX's 'NaN or Inf found in input tensor.' came once per non-finite scalar
    (ten times for a few skipped steps): now once."""
    import logging
    nan = float("nan")
    with caplog.at_level(logging.WARNING, logger="tensorboardX"):
        with MetricsLogger(tmp_path) as log:
            for step in range(1, 6):
                log.log(step, {"loss": nan, "grad_norm": nan})
    said = [r for r in caplog.records if "NaN or Inf" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


def test_metrics_logger_disabled(tmp_path):
    run = tmp_path / "off"
    log = MetricsLogger(run, enabled=False)
    log.log(1, {"loss": 1.0})
    log.close()
    assert not run.exists()


def test_logger_without_tensorboardx_still_writes_jsonl(tmp_path, monkeypatch):
    import sys
    import pytest
    from ptdp_jax.training.metrics import MetricsLogger
    monkeypatch.setitem(sys.modules, "tensorboardX", None)       # import now fails
    with pytest.warns(UserWarning, match="tensorboardX is not installed"):
        logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log(1, {"loss": 2.5})
    logger.close()
    assert '"loss": 2.5' in (tmp_path / "metrics.jsonl").read_text()
    assert not list(tmp_path.glob("events.out.tfevents.*"))


class _FakeWandb:
    """A stand-in for the wandb package: records init, log and finish."""

    def __init__(self):
        import types
        self.module = types.ModuleType("wandb")
        self.module.init = self.init
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, data, step=None):
        self.logged.append((step, dict(data)))

    def finish(self):
        self.finished += 1


def test_wandb_gets_the_metrics_of_metrics_jsonl(tmp_path, data_cache, monkeypatch):
    """run.wandb_project: a W&B run named by the run id gets every line of metrics.jsonl
    (its numbers, at its step) and the resolved config, and is finished at the end; unset,
    wandb is not touched; set without the package, the run is refused before compiling."""
    import sys
    import helpers_ckpt as H
    from ptdp_jax.config.load import ConfigError
    from ptdp_jax.run.loop import train
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake.module)
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 3, "model.num_layers": 1,
                                         "train.eval_every": 2, "checkpoint.dir": "",
                                         "run.wandb_project": "ptdp-test"})
    res = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log(), return_params=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [init] = fake.inits
    assert init["project"] == "ptdp-test" and init["id"] == res.run_id == lines[0]["run"]
    assert init["resume"] == "allow" and init["config"]["model"]["num_layers"] == 1
    assert [s for s, _ in fake.logged] == [r["step"] for r in lines] == [1, 2, 3]
    for (_, data), rec in zip(fake.logged, lines):
        assert data == {k: v for k, v in rec.items() if k not in ("step", "run")}
    assert "val_loss" in fake.logged[1][1] and fake.finished == 1
    train(mesh_shape=(1, 1, 1), overrides={**ov, "run.wandb_project": ""}, log=H.Log(),
          return_params=False)
    assert len(fake.inits) == 1
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr(sys.modules["ptdp_jax.run.loop"], "compile_all", None)   # never reached
    with pytest.raises(ConfigError, match=r"run.wandb_project='ptdp-test' needs the wandb "
                                          r"package \(pip install wandb\)"):
        train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
