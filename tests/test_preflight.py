"""The memory pre-flight: a run that cannot fit is refused before it
compiles (the estimate) or before it runs (XLA's memory analysis of the compiled step),
with the numbers and the settings that would fit; exit code 2 from the CLI. The device's
memory is pinned here (monkeypatch), so the tests do not depend on this machine's RAM."""
import importlib
import re

import pytest

import helpers_ckpt as H
from ptdp_jax.training import preflight as PF
from ptdp_jax.cli.train import main as cli_main
from ptdp_jax.exits import ExitCode
from ptdp_jax.run.dry_run import dry_run
from ptdp_jax.run.loop import resolve_config, train

T = importlib.import_module("ptdp_jax.run.loop")
GiB = 2 ** 30


@pytest.fixture
def device_gib(monkeypatch):
    """Set what a device has (GiB); compiling is an error unless allowed; gpu=True: refuse as
    off CPU, where the estimate alone names the settings that fit."""
    def set_(gib, allow_compile=False, gpu=False):
        monkeypatch.setattr(PF, "_device_memory", lambda: int(gib * GiB))
        if gpu:
            monkeypatch.setattr(PF, "_on_cpu", lambda: False)
            monkeypatch.setattr(PF, "_device_words", lambda: "a GPU has {have}")
        if not allow_compile:
            def no_compile(*a, **k):
                raise AssertionError("compiled although the run was refused")
            monkeypatch.setattr(T, "compile_all", no_compile)
    return set_


@pytest.mark.parametrize("config,mesh,words", [
    ("configs/llama-7b.yaml", "1,1,8", ["needs 15.92 GiB per device by the estimate",
                                        "the model state alone", "fills 39 devices"]),
    ("configs/gpt-1t.yaml", "1,8,1", ["needs 2150.15 GiB per device", "fills 5748 devices"]),
], ids=["llama-7b-1x1x8", "gpt-1t-1x8x1"])
def test_models_too_big_for_the_devices_are_refused(device_gib, capsys, config, mesh, words):
    """On 8 CPU devices of 2.94 GiB each (23.5 GiB of RAM) the 7B would grow without bound
    and the 1T die in a JaxRuntimeError: one line instead, exit 2, before anything compiles."""
    # 18 B per parameter (fp32 master, bf16 copy, fp32 grads, AdamW): 6.74e9 x 18 B / 2.94 GiB
    # = 38.4 -> 39 devices; the 1T: 5748
    device_gib(2.94)
    assert cli_main([config, "--mesh", mesh, "train.steps=2"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    for w in words + ["but a CPU device has 2.94 GiB", "tuning.skip_memory_check=true"]:
        assert w in err, (w, err)
    assert len(err.strip().splitlines()) == 1


def test_refusal_names_settings_that_fit(device_gib):
    """demo.yaml with model.seq_len=4096 (an OOM kill unchecked) on GPUs of 0.9 GiB:
    the settings named do fit, by the same estimate."""
    device_gib(0.9, gpu=True)
    cfg = resolve_config("configs/demo.yaml", None, {"model.seq_len": 4096})
    with pytest.raises(PF.MemoryCheckError) as e:
        PF.check_memory(cfg)
    msg = str(e.value)
    assert "needs 1.14 GiB per device" in msg and "a GPU has 0.90 GiB" in msg
    assert "Settings that fit (by the estimate): train.recompute=selective (0.75 GiB)" in msg
    assert "train.micro_batch_size=1" in msg
    assert isinstance(e.value, ValueError)                     # a ConfigError: exit 2
    fixed = resolve_config("configs/demo.yaml", None, {"model.seq_len": 4096,
                                                       "train.recompute": "selective"})
    assert PF.check_memory(fixed).total < 0.9 * GiB
    assert PF.check_memory(resolve_config(
        "configs/demo.yaml", None, {"model.seq_len": 4096, "tuning.skip_memory_check": True})) is None


def test_refusal_names_the_mlp_activation_under_selective(device_gib):
    """Selective recomputation keeps the MLP activation by default (auto); where that is what
    does not fit, dropping it is the lightest change named, and it fits."""
    device_gib(0.74, gpu=True)
    ov = {"model.seq_len": 4096, "train.recompute": "selective"}
    with pytest.raises(PF.MemoryCheckError) as e:
        PF.check_memory(resolve_config("configs/demo.yaml", None, ov))
    assert "Settings that fit (by the estimate): tuning.keep_ffn_activation=false (0.71 GiB)" \
        in str(e.value)
    fixed = resolve_config("configs/demo.yaml", None, {**ov, "tuning.keep_ffn_activation": False})
    assert PF.check_memory(fixed).total < 0.74 * GiB


def test_cpu_refusal_names_only_what_clearly_fits(device_gib):
    """On CPU the estimate leaves out the attention scores XLA keeps: at 0.9 GiB it would
    name recompute=selective (0.75 GiB) and micro-batches of 1 (0.83 GiB), which XLA's check
    refuses (1.22 and 0.95 GiB; 2026-11-28, 8 CPU devices); with the scores added only
    micro-batches of 1 with full recomputation clearly fit (XLA: 0.46 GiB)."""
    device_gib(0.9)
    with pytest.raises(PF.MemoryCheckError) as e:
        PF.check_memory(resolve_config("configs/demo.yaml", None, {"model.seq_len": 4096}))
    msg = str(e.value)
    assert "On CPU the estimate is approximate" in msg
    assert ("Settings that clearly fit (the estimate plus 3, 2 or 1 micro-batch's scores with "
            "recompute none, selective or full): train.micro_batch_size=1 train.recompute=full "
            "(0.72 GiB).") in msg


def test_compiled_step_checked_before_it_runs(tmp_path, data_cache, device_gib, monkeypatch):
    """The estimate passes (1.14 GiB: it assumes flash attention), but XLA's CPU attention
    keeps the 4096 x 4096 scores: the compiled step needs ~1.9 GiB, more than the 1.5
    GiB a device has here; refused after compiling, before the first step. The first
    setting it names passes XLA's check too."""
    device_gib(1.5, allow_compile=True)
    ran = []
    ov = {"model.seq_len": 4096, "train.steps": 1, "run.dir": str(tmp_path / "run"),
          "train.sample_tokens": 0}
    orig = T._restore_or_init
    monkeypatch.setattr(T, "_restore_or_init", lambda *a, **k: ran.append(1) or orig(*a, **k))
    with pytest.raises(PF.MemoryCheckError, match=r"the compiled train step \(XLA's memory "
                                                  r"analysis\) needs 1\.[6-9]\d GiB") as e:
        train("configs/demo.yaml", overrides=ov, log=H.Log())
    assert ran == [] and not (tmp_path / "run").exists()
    msg = str(e.value)
    assert re.search(r"Settings that clearly fit \(the estimate plus the 0\.\d\d GiB it missed "
                     r"here, scaled to each\): train\.recompute=selective \(1\.\d\d GiB\); "
                     r"train\.micro_batch_size=1 \(1\.\d\d GiB\)\.", msg), msg
    out = dry_run("configs/demo.yaml", overrides={**ov, "train.recompute": "selective"},
                  log=H.Log())
    assert out["total_bytes"] <= 1.5 * GiB


def test_compiled_bytes_from_memory_analysis():
    class Analysis:
        argument_size_in_bytes, output_size_in_bytes = 10, 20
        temp_size_in_bytes, alias_size_in_bytes = 100, 5

    class Exe:
        def memory_analysis(self):
            return Analysis()
    assert PF.compiled_bytes(Exe()) == 125
    assert PF.compiled_bytes(object()) is None
