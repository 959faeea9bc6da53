"""Careless input gets one clear line and the right exit code:
config files that are not YAML mappings, unknown keys (with "did you mean"), data too
short for one sequence, datasets of different tokenizers, a multi-process start without
its peers; and --print-config / --dry-run."""
import json
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import yaml

import helpers_ckpt as H
from ptdp_jax.cli.train import main as cli_main
from ptdp_jax.config.load import ConfigError, load_config, to_yaml
from ptdp_jax.exits import ExitCode
from ptdp_jax.run.feed import open_streams
from ptdp_jax.run.loop import resolve_config, resolved_config, train


def _cli(capsys, *args):
    rc = cli_main(list(map(str, args)))
    out = capsys.readouterr()
    return rc, out.out, out.err


# -------------------------------------------------------------- config files and keys

@pytest.mark.parametrize("text,words", [
    ("model:\n  hidden_size: [1, 2\n  num_heads: 4\n", ["line 3", "YAML syntax error"]),
    ("model: 4\n", ["line 1", "section 'model' must be a mapping", "got 4"]),
    ("train:\n  lr: 1e-3\nmodel: [a, b]\n", ["line 3", "section 'model' must be a mapping"]),
    ("train:\n  steps: many\n", ["line 2", "train.steps: cannot read 'many' as int"]),
    ("run:\n  dir: [a, b]\n", ["line 2", "run.dir: cannot read ['a', 'b'] as a string"]),
    ("train:\n  steps: 5\n  fp8: 2\n", ["line 3", "train.fp8: cannot read 2 as bool"]),
    ("train:\n  lr: .inf\n", ["line 2", "train.lr: cannot read inf as a finite float"]),
    ("train:\n  steps: 2.0\n", ["line 2", "train.steps: cannot read 2.0 as int"]),
    ("train:\n  stesp: 10\n", ["line 2", "unknown config key 'train.stesp'",
                               "did you mean 'train.steps'?"]),
    ("- a\n- b\n", ["must hold a mapping of sections"]),
    ("train:\n  steps: 5\n  lr: 1e-3\n  steps: 7\n",
     ["line 4", "'train.steps' is given twice (first on line 2)"]),
    ("model:\n  hidden_size: 32\ntrain:\n  steps: 5\nmodel:\n  num_layers: 2\n",
     ["line 5", "'model' is given twice (first on line 1)"]),
])
def test_bad_config_files_are_config_errors(tmp_path, capsys, text, words):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    for w in words + [str(f)]:
        assert w in str(e.value), (w, str(e.value))
    rc, _, err = _cli(capsys, f, "--print-config")
    assert rc == ExitCode.CONFIG and err.startswith("ptdp-train: config error:")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_config_path_that_is_a_directory(tmp_path, capsys):
    rc, _, err = _cli(capsys, tmp_path, "--print-config")
    assert rc == ExitCode.CONFIG
    assert f"config file '{tmp_path}' is a directory" in err


def test_did_you_mean(capsys):
    for key, hint in [("trian.steps", "train.steps"), ("model.hidden", "model.hidden_size"),
                      ("train.hidden_size", "model.hidden_size"), ("model.layers", "model.num_layers")]:
        with pytest.raises(ConfigError, match=f"did you mean '{hint}'"):
            load_config(overrides={key: 1})
    rc, _, err = _cli(capsys, "parallel.pipline=2", "--print-config")
    assert rc == ExitCode.CONFIG and "did you mean 'parallel.pipe'" in err


def test_data_shorter_than_a_sequence(tmp_path, data_cache, capsys):
    """A dataset of 20 tokens and model.seq_len=16: ConfigError naming data.path and
    model.seq_len, before anything is compiled; exit 2 from the CLI."""
    from ptdp_jax.data import prepare_dataset
    (tmp_path / "short.txt").write_text("nineteen characters")
    prefix = prepare_dataset([str(tmp_path / "short.txt")], tmp_path / "short")
    ov = H.tiny(tmp_path, data_cache, **{"data.path": str(prefix), "checkpoint.dir": ""})
    with pytest.raises(ConfigError) as e:
        open_streams(resolve_config(None, None, ov))
    assert f"data.path[0] = '{prefix}'" in str(e.value) and "model.seq_len=16" in str(e.value)
    rc, _, err = _cli(capsys, "--mesh", "1,1,1", *[f"{k}={v}" for k, v in ov.items()])
    assert rc == ExitCode.CONFIG and "model.seq_len=16" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    # the embedded corpus against an absurd sequence length: the same kind of error
    with pytest.raises(ConfigError, match="<embedded corpus>.*model.seq_len=100000000"):
        open_streams(resolve_config(None, None, {**ov, "data.path": [],
                                                 "model.seq_len": 100_000_000}))


def test_print_config_round_trips(capsys):
    rc, out, _ = _cli(capsys, "configs/demo.yaml", "--mesh", "1,2,1", "train.steps=7",
                      "model.num_kv_heads=null", "--print-config")
    assert rc == 0
    tree = yaml.safe_load(out)
    assert tree["train"]["steps"] == 7 and tree["parallel"]["pipe"] == 2
    from ptdp_jax.run.resolve import spelled_out               # model.ffn_hidden_size: 512
    want = spelled_out(resolved_config("configs/demo.yaml", (1, 2, 1), {"train.steps": 7}))
    from ptdp_jax.config.load import flatten
    assert load_config(overrides=flatten(tree)) == want
    assert yaml.safe_load(to_yaml(want)) == tree


def test_dry_run_compiles_and_reports(tmp_path, data_cache, capsys):
    ov = H.tiny(tmp_path, data_cache, **{"checkpoint.dir": ""})
    rc, out, err = _cli(capsys, "--mesh", "1,2,2", "--dry-run",
                        *[f"{k}={v}" for k, v in ov.items()])
    assert rc == 0, err
    assert "dry run: gpt 4x32, mesh (data, pipe, tensor) = (1, 2, 2)" in out
    assert "memory per device (XLA):" in out and "model FLOPs per step:" in out
    assert not (tmp_path / "run").exists()               # nothing trained, nothing logged


@pytest.mark.parametrize("mesh", ["2,2,2", "1,2,4"])
def test_bfloat16_pipeline_with_tensor_dry_runs(tmp_path, data_cache, mesh):
    """The demo's layout in bfloat16 compiles on CPU: a subprocess, since XLA:CPU's failure
    here was a C++ abort (SIGABRT) in AllReducePromotion, on the head's psum over 'pipe'."""
    ov = H.tiny(tmp_path, data_cache, **{"checkpoint.dir": "", "train.dtype": "bfloat16"})
    r = subprocess.run(
        [sys.executable, "-m", "ptdp_jax.cli.train", "configs/demo.yaml", "--mesh", mesh, "--dry-run",
         *[f"{k}={v}" for k, v in ov.items()]],
        cwd=H.REPO, env=H.subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert f"mesh (data, pipe, tensor) = ({mesh.replace(',', ', ')})" in r.stdout


# --------------------------------------------------------------------------- datasets

def test_datasets_of_different_tokenizers_do_not_blend(tmp_path, data_cache):
    from ptdp_jax.data import prepare_dataset
    text = tmp_path / "a.txt"
    text.write_text("Some text for a tokenizer to learn from. " * 200)
    byte = prepare_dataset([str(text)], tmp_path / "byte")
    bpe = prepare_dataset([str(text)], tmp_path / "bpe", tokenizer="bpe", bpe_vocab_size=300)
    byte2 = prepare_dataset([str(text)], tmp_path / "byte2")
    ov = H.tiny(tmp_path, data_cache, **{"data.path": [str(byte), str(bpe)],
                                         "model.vocab_size": 300, "checkpoint.dir": ""})
    with pytest.raises(ConfigError) as e:
        train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    msg = str(e.value)
    assert f"data.path[0] = '{byte}'" in msg and f"data.path[1] = '{bpe}'" in msg
    assert "different tokenizers ('byte' and" in msg and "bpe.tokenizer.json" in msg
    # the same tokenizer (two byte datasets, or two copies of one tokenizer.json) blends
    open_streams(resolve_config(None, None, {**ov, "data.path": [str(byte), str(byte2)]}))
    import shutil
    shutil.copy(f"{bpe}.bin", tmp_path / "copy.bin")
    shutil.copy(f"{bpe}.idx.npy", tmp_path / "copy.idx.npy")
    (tmp_path / "sub").mkdir()
    shutil.copy(f"{bpe}.tokenizer.json", tmp_path / "sub" / "tok.json")
    meta = json.loads(open(f"{bpe}.json").read())
    meta["tokenizer"] = "sub/tok.json"
    (tmp_path / "copy.json").write_text(json.dumps(meta))
    open_streams(resolve_config(None, None, {**ov, "data.path": [str(bpe), str(tmp_path / "copy")]}))


def test_a_checkpoint_refuses_data_of_another_tokenizer(tmp_path, data_cache):
    """Resuming, or evaluating, a model on data whose ids come from another tokenizer is
    refused before compiling, naming both tokenizers; a copy of the same tokenizer.json
    passes."""
    import shutil
    from ptdp_jax.checkpoint.manager import CheckpointError
    from ptdp_jax.data import prepare_dataset
    from ptdp_jax.run.evaluate import evaluate_checkpoint
    text = tmp_path / "a.txt"
    text.write_text("Some text for a tokenizer to learn from. " * 200)
    bpe = prepare_dataset([str(text)], tmp_path / "bpe", tokenizer="bpe", bpe_vocab_size=300)
    byte = prepare_dataset([str(text)], tmp_path / "byte")
    ov = H.tiny(tmp_path, data_cache, **{"data.path": [str(bpe)], "model.vocab_size": 300,
                                         "train.steps": 1})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    log = H.Log()
    with pytest.raises(CheckpointError) as e:
        train(mesh_shape=(1, 1, 1), overrides={**ov, "data.path": [str(byte)], "train.steps": 2},
              log=log)
    msg = str(e.value)
    assert "bpe.tokenizer.json" in msg and f"data.path[0] = '{byte}'" in msg and "'byte'" in msg
    assert not any("compil" in line for line in log.lines)
    with pytest.raises(CheckpointError, match="the same ids mean other text"):
        evaluate_checkpoint(tmp_path / "ckpt", overrides={"data.path": [str(byte)]})
    for suffix in (".bin", ".idx.npy", ".json", ".tokenizer.json"):   # the same tokenizer
        shutil.copy(f"{bpe}{suffix}", tmp_path / f"copy{suffix}")
    meta = json.loads((tmp_path / "copy.json").read_text())
    meta["tokenizer"] = "copy.tokenizer.json"
    (tmp_path / "copy.json").write_text(json.dumps(meta))
    out = train(mesh_shape=(1, 1, 1), log=H.Log(),
                overrides={**ov, "data.path": [str(tmp_path / "copy")], "train.steps": 2})
    assert out.start_step == 1


# --------------------------------------------------------------- multi-process starts

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("process_id,words", [
    (0, "process 1 did not connect within 2 s"),
    (1, "process 0 was not reachable at localhost:"),
])
def test_multiprocess_start_without_peers_exits_5(tmp_path, process_id, words):
    """--num-processes 2 with no peer: exit 5 and one line naming the missing process,
    not a C++ abort (exit 134)."""
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "ptdp_jax.cli.train", "--coordinator", f"localhost:{_free_port()}",
         "--num-processes", "2", "--process-id", str(process_id), "--init-timeout", "2",
         "train.steps=1", f"run.dir={tmp_path / 'run'}"],
        cwd=H.REPO, env=H.subprocess_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
        timeout=120)
    assert r.returncode == ExitCode.DISTRIBUTED_INIT, (r.returncode, r.stderr[-3000:])
    assert words in r.stderr and "Check failure" not in r.stderr, r.stderr[-3000:]
    assert "--init-timeout" in r.stderr
    assert time.monotonic() - t0 < 60


def test_rendezvous_brings_processes_together():
    """The rendezvous itself, in threads: both return once both are there; a third
    process id outside the count is refused by process 0."""
    import threading
    from ptdp_jax.parallel import distributed as DIST
    from ptdp_jax.parallel.rendezvous import rendezvous
    port = _free_port()
    setups = [DIST.ProcessSetup(f"localhost:{port}", 2, i, "explicit") for i in range(2)]
    errors, done = [], []

    def run(s):
        try:
            rendezvous(s, 20)
            done.append(s.process_id)
        except Exception as e:             # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in reversed(setups)]
    for t in threads:
        t.start()
        time.sleep(0.3)                    # process 1 first: it has to retry
    for t in threads:
        t.join(30)
    assert not errors and sorted(done) == [0, 1]
    # and the port is free again for jax.distributed's service
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))


# ----------------------------------------------------------------------------- checkpoint.dir

@pytest.mark.parametrize("case", ["a-file", "under-a-file", "not-writable", "other-model"])
def test_checkpoint_dir_problems_are_found_before_compiling(tmp_path, data_cache, monkeypatch,
                                                            capsys, case):
    """A checkpoint.dir that is a file, lies under a file, cannot be written, or holds a
    checkpoint of another model (resuming): exit 6 with one line naming it, before the
    step is compiled."""
    import os
    from pathlib import Path
    from ptdp_jax.checkpoint.format import FORMAT, VERSION, _shape_tree

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the checkpoint.dir check")
    monkeypatch.setattr(sys.modules["ptdp_jax.run.loop"], "compile_all", no_compile)
    ckpt = tmp_path / "ckpt"
    if case == "a-file":
        ckpt.write_text("x")
        words = f"checkpoint.dir {ckpt} exists and is not a directory"
    elif case == "under-a-file":
        (tmp_path / "f").write_text("x")
        ckpt = tmp_path / "f" / "ckpt"
        words = f"{tmp_path / 'f'} is a file, not a directory"
    elif case == "not-writable":
        if os.geteuid() == 0:                     # root writes through any file mode
            ckpt = Path("/sys/ptdp_jax_test_ckpt")
        else:
            ckpt.mkdir()
            ckpt.chmod(0o500)
        words = f"checkpoint.dir {ckpt} is not writable"
    else:
        ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2})
        other = resolve_config(None, None, {**ov, "model.hidden_size": 64})
        meta = {"format": FORMAT, "version": VERSION, "step": 3, "config": other.to_dict(),
                "param_shapes": _shape_tree(other.model)}
        (ckpt / "3" / "meta").mkdir(parents=True)
        (ckpt / "3" / "meta" / "ptdp_meta.json").write_text(json.dumps(meta))
        words = "is of a different model: model.hidden_size: checkpoint 64, config 32;"
    ov = H.tiny(tmp_path, data_cache, **{"checkpoint.dir": str(ckpt), "model.num_layers": 2})
    rc, _, err = _cli(capsys, "--mesh", "1,1,1", *[f"{k}={v}" for k, v in ov.items()])
    assert rc == ExitCode.CHECKPOINT and words in err, err
    assert err.count("\n") == 1


def test_print_config_is_the_config_that_would_run(capsys):
    """--print-config resolves the auto settings for the devices here and validates."""
    rc, out, _ = _cli(capsys, "configs/tiny-gpt.yaml", "--print-config")
    tree = yaml.safe_load(out)
    assert rc == 0 and tree["train"]["dtype"] == "float32" and tree["train"]["recompute"] == "none"
    rc, _, err = _cli(capsys, "configs/tiny-gpt.yaml", "train.log_every=0", "--print-config")
    assert rc == ExitCode.CONFIG and "train.log_every must be positive, got 0" in err


@pytest.mark.parametrize("config,ffn,kv", [("configs/tiny-gpt.yaml", 4 * 32, None),
                                           ("configs/llama3-8b.yaml", 14336, 8),
                                           ("configs/tiny-llama.yaml", 96, 4)])
def test_print_config_shows_the_sizes_that_run(config, ffn, kv, tmp_path, capsys):
    """model.ffn_hidden_size (and LLaMA's num_kv_heads) as the run uses them, not null; the
    printed config, read again, prints the same."""
    rc, out, _ = _cli(capsys, config, "--mesh", "1,1,1", "--print-config")
    model = yaml.safe_load(out)["model"]
    assert rc == 0 and model["ffn_hidden_size"] == ffn and model["num_kv_heads"] == kv, model
    (tmp_path / "printed.yaml").write_text(out)
    assert _cli(capsys, tmp_path / "printed.yaml", "--mesh", "1,1,1", "--print-config")[1] == out


def test_a_dotted_resume_wins_over_the_flag(capsys):
    """Dotted overrides come last: checkpoint.resume=... beats --resume / --no-resume."""
    for flag, dotted, want in (("--no-resume", "overwrite", "overwrite"),
                               ("--resume", "false", False), ("--no-resume", None, False)):
        args = ["configs/tiny-gpt.yaml", flag, "--print-config"]
        rc, out, _ = _cli(capsys, *args, *([f"checkpoint.resume={dotted}"] if dotted else []))
        assert rc == 0 and yaml.safe_load(out)["checkpoint"]["resume"] == want, (flag, dotted)


def test_mesh_against_an_override_of_its_sizes(capsys):
    rc, _, err = _cli(capsys, "configs/tiny-gpt.yaml", "--mesh", "2,1,1", "parallel.data=4",
                      "--print-config")
    assert rc == ExitCode.CONFIG
    assert "the mesh (2, 1, 1) sets parallel.data=2, and the overrides set parallel.data=4" in err
    rc, out, _ = _cli(capsys, "configs/tiny-gpt.yaml", "--mesh", "2,1,1", "parallel.data=2",
                      "--print-config")
    assert rc == 0 and yaml.safe_load(out)["parallel"]["data"] == 2


def test_cudnn_attention_needs_a_gpu_and_16_bit_compute():
    from types import SimpleNamespace
    from ptdp_jax.config.validation import check_devices
    cfg = load_config(overrides={"tuning.attention": "cudnn", "train.dtype": "float32"})
    with pytest.raises(ConfigError, match=r"tuning.attention=cudnn needs cuDNN, on a GPU; the "
                                          r"devices here are cpu"):
        check_devices(cfg, jax.devices())
    h100 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H100", compute_capability="9.0")
    with pytest.raises(ConfigError, match="16-bit compute .* no float32.*train.dtype=bfloat16"):
        check_devices(cfg, [h100])
    check_devices(load_config(overrides={"tuning.attention": "cudnn",
                                         "train.dtype": "bfloat16"}), [h100])


@pytest.mark.parametrize("key", ["run.dir", "run.compile_cache"])
def test_output_directories_are_checked_before_compiling(tmp_path, data_cache, monkeypatch,
                                                         capsys, key):
    """run.dir or run.compile_cache naming a file (or a folder under one): exit 2 with one
    line naming the key, before the step is compiled."""
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the directories were checked")
    monkeypatch.setattr(sys.modules["ptdp_jax.run.loop"], "compile_all", no_compile)
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" if key == "run.dir" else tmp_path / "afile" / "cache"
    ov = H.tiny(tmp_path, data_cache, **{"checkpoint.dir": "", key: str(bad)})
    rc, _, err = _cli(capsys, "--mesh", "1,1,1", *[f"{k}={v}" for k, v in ov.items()])
    assert rc == ExitCode.CONFIG and err.count("\n") == 1, err
    assert f"{key}='{bad}'" in err and "not a directory" in err, err


def test_a_fresh_start_over_checkpoints_is_a_config_error(tmp_path, data_cache, capsys):
    """--no-resume where checkpoints are: exit 2 (a setting to change), before compiling."""
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=lambda *a: None)
    rc, out, err = _cli(capsys, "--mesh", "1,1,1", "--no-resume",
                        *[f"{k}={v}" for k, v in ov.items()])
    assert rc == ExitCode.CONFIG and "holds checkpoints of an earlier run (steps 2)" in err
    assert "compiling" not in out


@pytest.mark.parametrize("mesh,words", [
    ("1,16,1", "XLA_FLAGS=--xla_force_host_platform_device_count=16"),
    ("6,64,8", "a mesh for a cluster: `ptdp-plan CONFIG --gpus 3072` plans it")])
def test_a_mesh_too_large_says_what_would_run(capsys, mesh, words):
    rc, _, err = _cli(capsys, "configs/tiny-gpt.yaml", "--mesh", mesh, "--print-config")
    assert rc == ExitCode.CONFIG and words in err


def test_a_run_that_logs_nothing_leaves_no_tensorboard_file(tmp_path):
    from ptdp_jax.training.metrics import MetricsLogger
    MetricsLogger(tmp_path).close()
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    with MetricsLogger(tmp_path) as log:
        log.log(1, {"loss": 1.0})
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_an_empty_run_dir_is_refused(tmp_path, data_cache):
    ov = H.tiny(tmp_path, data_cache, **{"run.dir": ""})
    with pytest.raises(ConfigError, match="run.dir is empty"):
        train(mesh_shape=(1, 1, 1), overrides=ov, log=lambda *a: None)


def test_a_null_override_unsets_its_key(capsys):
    """checkpoint.dir=null and run.dir=null on the command line: the defaults (no checkpoints,
    runs/latest), not folders named None; a null mesh key leaves the key to --mesh."""
    rc, out, err = _cli(capsys, "configs/demo.yaml", "--mesh", "1,2,1", "checkpoint.dir=null",
                        "run.dir=null", "parallel.pipe=null", "--print-config")
    assert rc == 0, err
    tree = yaml.safe_load(out)
    assert tree["checkpoint"]["dir"] == "" and tree["run"]["dir"] == "runs/latest"
    assert tree["parallel"]["pipe"] == 2
