"""The layout that runs (resolve.for_devices, decisions.layout_source): parallel.layout=auto asks
the planner anywhere; on GPUs a config without a mesh, or whose mesh needs more devices than
there are, gets the planner's best layout for the devices at hand (one line says so, with the
predicted step and memory); a mesh given on the command line gets the layout keys nothing set
filled in; a config whose mesh fits runs as written, and so does anything on CPUs. GPUs are
stand-ins here (the planner prices them as H200s); nothing is compiled for them."""
from types import SimpleNamespace

import jax
import pytest

from ptdp_jax.config import decisions as D
from ptdp_jax.config.load import ConfigError
from ptdp_jax.run.resolve import for_devices
from ptdp_jax.run.loop import _load, resolve_config, train

TINY = {"model.num_layers": 4, "model.hidden_size": 32, "model.num_heads": 4, "model.seq_len": 16,
        "train.global_batch_size": 8, "train.micro_batch_size": 1, "train.steps": 2,
        "train.eval_every": 0, "parallel.layout": "auto"}
MODEL = ("model:\n  arch: gpt\n  num_layers: 24\n  hidden_size: 2048\n  num_heads: 16\n"
         "  vocab_size: 51200\n  seq_len: 2048\ntrain:\n  global_batch_size: 16\n")


def gpus(n):
    return [SimpleNamespace(platform="gpu")] * n


def resolved(config, mesh=None, overrides=None, devices=None, lines=None):
    """(Config that runs, its line) of a config loaded as ptdp-train loads it."""
    lines = [] if lines is None else lines
    run = for_devices(*_load(config, mesh, overrides or {}), devices or jax.devices(),
                      lines.append, gpu="h200")
    return run.config, run.note


def test_auto_layout_picks_a_valid_layout_and_trains(tmp_path):
    ov = dict(TINY, **{"run.dir": str(tmp_path / "run")})
    cfg, note = resolved(None, None, ov)
    d, p, t = cfg.parallel.mesh_shape
    assert d * p * t <= len(jax.devices()) and (d, p, t) != (1, 1, 1)   # 8 devices get used
    assert note.startswith("parallel.layout=auto: the planner's layout for 8 devices: mesh")
    res = train(None, overrides=ov, log=lambda *a, **k: None)
    assert len(res.losses) == 2 and all(l == l for l in res.losses)
    assert res.layout.startswith("parallel.layout=auto")


def test_auto_layout_on_cpu_predicts_no_step_time():
    """On CPU devices the planner's layout says it was planned for GPUs and predicts no step
    time (it printed an H200's "predicted 0.0052 s a step" as this machine's)."""
    run = for_devices(*_load(None, None, TINY), jax.devices(), lambda *a: None, gpu="h200")
    assert run.note.startswith("parallel.layout=auto: the planner's layout for 8 devices: mesh")
    assert "predicted" not in run.note.replace("no step time is predicted", "")
    assert run.note.endswith("planned as for h200 GPUs, so no step time is predicted on cpu")
    assert run.predicted_step_s is None and run.memory_gib > 0


def test_explicit_keys_win():
    cfg, _ = resolved(None, None, dict(TINY, **{"parallel.pipe": 2, "train.recompute": "full"}))
    assert cfg.parallel.pipe == 2 and cfg.train.recompute == "full"
    cfg, _ = resolved(None, (2, 1, 2), TINY)
    assert cfg.parallel.mesh_shape == (2, 1, 2)


def test_manual_runs_as_written_on_cpu_and_a_bad_value_is_refused():
    ov = dict(TINY, **{"parallel.layout": "manual"})
    lines = []
    cfg, note = resolved(None, None, ov, lines=lines)
    assert cfg.parallel.mesh_shape == (1, 1, 1) and note == "" and lines == []
    with pytest.raises(ConfigError, match="parallel.layout"):
        resolved(None, None, dict(TINY, **{"parallel.layout": "best"}))
    with pytest.raises(ConfigError, match=r"needs 16 devices, only 8 available"):   # CPU: as
        resolved(None, (4, 1, 4), dict(TINY, **{"parallel.layout": "manual"}))     # written


def test_a_mesh_for_more_gpus_gets_the_planner(tmp_path):
    """The config's mesh (64, 1, 8) needs 512 GPUs: on 2 the planner's layout runs, said in one
    line with its predicted step and memory; the config's layout keys are searched over."""
    f = tmp_path / "big.yaml"
    f.write_text(MODEL + "  micro_batch_size: 1\nparallel:\n  data: 64\n  tensor: 8\n")
    lines = []
    cfg, note = resolved(f, devices=gpus(2), lines=lines)
    d, p, t = cfg.parallel.mesh_shape
    assert d * p * t == 2 and lines == [note]
    assert note.startswith("the config's mesh (data, pipe, tensor) = (64, 1, 8) needs 512 "
                           "devices, 2 here: the planner's layout for 2 devices: mesh")
    assert " s a step, " in note and note.endswith(" GiB a device")
    assert cfg.train.dtype == "bfloat16" and cfg.train.recompute != "auto"


def test_a_mesh_that_fits_runs_as_written_on_gpus(tmp_path):
    f = tmp_path / "two.yaml"
    f.write_text(MODEL + "  micro_batch_size: 2\nparallel:\n  data: 2\n")
    cfg, note = resolved(f, devices=gpus(2))
    assert cfg.parallel.mesh_shape == (2, 1, 1) and cfg.train.micro_batch_size == 2
    assert cfg.parallel.zero == 0 and cfg.parallel.schedule == "1f1b"
    assert note.startswith("layout as written: mesh (data, pipe, tensor) = (2, 1, 1)")
    assert "predicted" in note


def test_only_a_mesh_gets_the_unset_layout_keys_filled_in(tmp_path):
    """--mesh 1,2,1 with a config that sets the micro batch only: the mesh and the micro batch
    stay; schedule, virtual stages, zero and recompute are the planner's."""
    f = tmp_path / "m.yaml"
    f.write_text(MODEL + "  micro_batch_size: 2\n")
    lines = []
    cfg, note = resolved(f, (1, 2, 1), devices=gpus(2), lines=lines)
    assert cfg.parallel.mesh_shape == (1, 2, 1) and cfg.train.micro_batch_size == 2
    assert cfg.train.recompute in D.RECOMPUTE_ORDER and cfg.parallel.schedule != "gpipe"
    assert note.startswith("the planner filled in the layout keys nothing set: mesh "
                           "(data, pipe, tensor) = (1, 2, 1)")
    # every fill key given: as written
    full = {"parallel.schedule": "1f1b", "parallel.virtual_stages": 1, "parallel.zero": 0,
            "train.recompute": "full"}
    cfg, note = resolved(f, (1, 2, 1), full, devices=gpus(2))
    assert cfg.train.recompute == "full" and note.startswith("layout as written")


def test_a_config_without_a_mesh_gets_the_planner_on_gpus_only(tmp_path):
    f = tmp_path / "none.yaml"
    f.write_text(MODEL)
    cfg, note = resolved(f, devices=gpus(2))
    assert cfg.parallel.data * cfg.parallel.pipe * cfg.parallel.tensor == 2
    assert note.startswith("the config sets no mesh (parallel.data, pipe, tensor): the "
                           "planner's layout for 2 devices")
    cfg = resolve_config(f)                      # as loaded: nothing chosen yet
    assert (cfg.train.dtype, cfg.train.recompute) == ("auto", "auto")


def test_dtype_auto_is_bf16_on_gpus_and_float32_on_cpus(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MODEL + "parallel:\n  data: 2\n")
    assert resolved(f, devices=gpus(2))[0].train.dtype == "bfloat16"
    small = dict(TINY, **{"parallel.layout": "manual"})
    assert resolved(None, None, small)[0].train.dtype == "float32"
    assert resolved(None, None, {**small, "train.dtype": "bfloat16"})[0].train.dtype == "bfloat16"


@pytest.mark.parametrize("gib, want", [(64, "none"), (1.1, "selective"), (0.9, "full"),
                                       (0.01, "full")])
def test_recompute_auto_is_the_least_that_fits(gib, want, monkeypatch):
    """train.recompute=auto: none where it fits the device by the estimate, else selective,
    else full, and full where nothing fits (the memory check then says so). Here a 4-layer
    h 256 model at s 1024, micro batch 8: 1.19, 1.00 and 0.75 GiB by the estimate."""
    import ptdp_jax.training.memory as MEM
    monkeypatch.setattr(MEM, "device_memory_bytes", lambda device=None: int(gib * 2 ** 30))
    ov = {"model.hidden_size": 256, "model.seq_len": 1024, "train.micro_batch_size": 8,
          "train.global_batch_size": 8}
    assert resolved(None, (1, 1, 1), ov)[0].train.recompute == want
    assert resolved(None, (1, 1, 1), {**ov, "train.recompute": "full"})[0].train.recompute == "full"
