"""What a new user trips over gets one clear message and the right exit code: malformed
command-line values, overwrites of a dataset or an export, damaged checkpoints, a model
mismatch, a tokenizer that does not fit the model; and model.vocab_size follows the data.
(Duplicated YAML keys: test_user_errors.py; an export's token ids: test_export.py.)"""
import shutil
import subprocess
import sys

import pytest

import helpers_ckpt as H
from ptdp_jax.config.load import ConfigError, parse_cli_overrides
from ptdp_jax.exits import ExitCode


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    """A tiny GPT trained 2 steps on the embedded byte corpus: checkpoints 1 and 2."""
    from ptdp_jax.run.loop import train
    tmp = tmp_path_factory.mktemp("trained")
    ov = H.tiny(tmp, data_cache, **{"train.steps": 2, "checkpoint.every": 1,
                                    "model.num_layers": 2})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    return tmp / "ckpt", ov


@pytest.fixture(scope="module")
def trained_bpe(tmp_path_factory, data_cache):
    """A tiny GPT trained 1 step on a BPE dataset of up to 300 ids (its end of document:
    id 0); model.vocab_size unset: it follows the data."""
    from ptdp_jax.data import prepare_dataset
    from ptdp_jax.run.loop import train
    tmp = tmp_path_factory.mktemp("trained_bpe")
    (tmp / "a.txt").write_text("Some text for a tokenizer to learn from. " * 200)
    prefix = prepare_dataset([str(tmp / "a.txt")], tmp / "bpe", tokenizer="bpe",
                             bpe_vocab_size=300)
    ov = H.tiny(tmp, data_cache, **{"train.steps": 1, "model.num_layers": 2,
                                    "data.path": str(prefix)})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    return tmp / "ckpt", prefix


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, *map(str, args)], cwd=H.REPO, capture_output=True,
                          text=True, timeout=timeout, env=H.subprocess_env(JAX_PLATFORMS="cpu"))


def _tool(module):
    """The arguments that run a command-line tool's main() as its console script does."""
    return ["-c", f"import sys; from {module} import main; sys.exit(main())"]


def _clean(r, code):
    """Exit `code` and no traceback."""
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Event loop is closed" not in r.stderr, r.stderr[-3000:]


# ----------------------------------------------------------------------------- overrides

def test_malformed_override_value_is_a_config_error(capsys):
    """A value that is not YAML: ConfigError naming the key and the value, exit 2 from
    ptdp-train (a subprocess: no traceback), ptdp-eval and ptdp-plan."""
    from ptdp_jax.cli.eval import main as eval_main
    from ptdp_jax.cli.plan import main as plan_main
    items = ["data.path=[data/x", "train.lr={"]
    for item in items:
        value = item.split("=", 1)[1]
        with pytest.raises(ConfigError) as e:
            parse_cli_overrides(["train.steps=2", item])
        assert f"override {item}: cannot parse {value!r}" in str(e.value)
        assert eval_main(["no-such-checkpoint", item]) == ExitCode.CONFIG
        assert plan_main(["configs/tiny-gpt.yaml", "--gpus", "8", item]) == ExitCode.CONFIG
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith(f"ptdp-eval: config error: override {item}: cannot parse")
        assert err[1].startswith(f"ptdp-plan: config error: override {item}: cannot parse")
    r = _run(*_tool("ptdp_jax.cli.train"), "configs/tiny-gpt.yaml", "--print-config", items[0])
    _clean(r, ExitCode.CONFIG)
    assert r.stderr.strip() == ("ptdp-train: config error: override data.path=[data/x: cannot "
                                "parse '[data/x' as a YAML value: expected ',' or ']', but "
                                "got '<stream end>'"), r.stderr


# ----------------------------------------------------------------------------- overwrites

def test_prepare_data_refuses_to_overwrite(tmp_path, capsys):
    from ptdp_jax.data import TokenDataset
    from ptdp_jax.data.prepare import main
    (tmp_path / "a.txt").write_text("first text " * 20)
    (tmp_path / "b.txt").write_text("second, longer text " * 40)
    out = tmp_path / "ds"
    assert main([str(tmp_path / "a.txt"), "--out", str(out)]) == 0
    before = H.snapshot(tmp_path)
    for extra in ([], ["--tokenizer", "bpe", "--vocab-size", "300"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path / "b.txt"), "--out", str(out), *extra])
        assert e.value.code == ExitCode.CONFIG
        err = capsys.readouterr().err
        assert f"--out '{out}': a dataset is already there" in err and "--overwrite" in err
        assert H.snapshot(tmp_path) == before
    assert main([str(tmp_path / "b.txt"), "--out", str(out), "--overwrite"]) == 0
    assert TokenDataset(out).num_tokens == len("second, longer text " * 40) + 1


def test_export_refuses_to_overwrite(trained, tmp_path, capsys):
    from ptdp_jax.interop import export as EX
    from ptdp_jax.cli import export as export_cli
    ckpt, _ = trained
    out = tmp_path / "hf"
    assert export_cli.main([str(ckpt), str(out)]) == 0
    before = H.snapshot(out)
    assert export_cli.main([str(ckpt / "1"), str(out)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert f"'{out}' already holds an export (config.json," in err and "--overwrite" in err
    assert H.snapshot(out) == before
    assert export_cli.main([str(ckpt / "1"), str(out), "--overwrite"]) == 0
    assert H.snapshot(out) != before


# ----------------------------------------------------------------------------- damaged checkpoints

def _damaged_copy(trained, tmp_path, how):
    ckpt, ov = trained
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    if how == "removed":                     # every array file
        for f in (copy / "2" / "state").rglob("d/*"):
            f.unlink()
    else:                                    # the arrays' data files, not their metadata
        for f in (copy / "2" / "state" / "ocdbt.process_0" / "d").iterdir():
            f.write_bytes(f.read_bytes()[:50])
    return copy, {**ov, "checkpoint.dir": str(copy), "run.dir": str(tmp_path / "run")}


def test_damaged_checkpoint_is_one_message_with_the_way_back(trained, tmp_path):
    """Arrays of the newest checkpoint removed: no tracebacks of orbax's closed event loop
    around the message, which names the older checkpoint and how to resume from it."""
    copy, ov = _damaged_copy(trained, tmp_path, "removed")
    r = _run(*H.cli_command({**ov, "train.steps": 3})[1:])
    _clean(r, ExitCode.CHECKPOINT)
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("ptdp_jax: ")]
    assert len(lines) == 1, r.stderr
    assert f"checkpoint {copy / '2'} is corrupt or incomplete" in lines[0]
    assert f"the newest older checkpoint is step 1 ({copy / '1'})" in lines[0]
    assert f"mv {copy / '2'} " in lines[0]


def test_truncated_checkpoint_names_the_failed_read(trained, tmp_path):
    """Truncated array files, read by ptdp-eval: the message says which read failed (not
    a TensorStore repr) and which older step directory to give instead."""
    copy, _ = _damaged_copy(trained, tmp_path, "truncated")
    r = _run(*_tool("ptdp_jax.cli.eval"), copy)
    _clean(r, ExitCode.CHECKPOINT)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "TensorStore" not in r.stderr and "pybind11" not in r.stderr, r.stderr
    assert "is not valid for value of size 50" in r.stderr
    assert f"the newest older checkpoint is step 1: give {copy / '1'} instead" in r.stderr


def test_a_step_without_its_metadata_gets_the_way_back(trained, tmp_path, capsys):
    """The newest step folder without meta/ptdp_meta.json (said only "is not a ptdp_jax
    checkpoint"): the advice of a damaged state, to resume from step 1 or give it instead."""
    from ptdp_jax.cli.eval import main as eval_main
    from ptdp_jax.cli.train import main as train_main
    ckpt, ov = trained
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    (copy / "2" / "meta" / "ptdp_meta.json").unlink()
    ov = {**ov, "checkpoint.dir": str(copy), "run.dir": str(tmp_path / "run"), "train.steps": 3}
    assert train_main(["--mesh", "1,1,1", *[f"{k}={v}" for k, v in ov.items()]]) == \
        ExitCode.CHECKPOINT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{copy / '2'} is not a ptdp_jax checkpoint: no meta/ptdp_meta.json" in err
    assert f"the newest older checkpoint is step 1 ({copy / '1'})" in err
    assert f"mv {copy / '2'} " in err
    assert eval_main([str(copy)]) == ExitCode.CHECKPOINT
    assert f"the newest older checkpoint is step 1: give {copy / '1'} instead" in \
        capsys.readouterr().err


def test_resuming_bpe_on_byte_data_names_the_tokenizer(trained_bpe, tmp_path, capsys):
    """A BPE model's checkpoint.dir resumed on the embedded byte corpus: the tokenizer is
    named, as ptdp-eval names it (it blamed model.vocab_size, which nobody set)."""
    from ptdp_jax.cli.train import main as train_main
    ckpt, _ = trained_bpe
    ov = {**H.tiny(tmp_path, None, **{"train.steps": 2, "model.num_layers": 2}),
          "checkpoint.dir": str(ckpt)}
    assert train_main(["--mesh", "1,1,1", *[f"{k}={v}" for k, v in ov.items()]]) == \
        ExitCode.CHECKPOINT
    err = capsys.readouterr().err
    assert "was trained on the token ids of tokenizer" in err and "holds those of 'byte'" in err
    assert "model.vocab_size" not in err and len(err.strip().splitlines()) == 1, err


def test_a_warning_is_one_line(tmp_path):
    """A command's warning is `ptdp-train: warning: ...` (it printed `load.py:148:
    ConfigWarning: ...` and the line of code under it)."""
    r = _run(*_tool("ptdp_jax.cli.train"), "configs/tiny-gpt.yaml", "--print-config",
             "checkpoint.overwrite=true")
    _clean(r, ExitCode.OK)
    assert r.stderr.startswith("ptdp-train: warning: config file 'configs/tiny-gpt.yaml': keys "
                               "of an earlier version: checkpoint.overwrite=true is now "
                               "checkpoint.resume=overwrite")
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("flags", ["--xla_force_host_platform_device_count=eight",
                                   "--xla_force_host_platform_device_count=",
                                   "--xla_backend_optimization_level=0 "
                                   "--xla_force_host_platform_device_count=0"])
def test_a_malformed_device_count_in_xla_flags_is_one_line(flags):
    """XLA_FLAGS with a device count that is not a whole number >= 1: one line before jax
    starts, exit 2 (XLA printed its 94-line flag list and aborted)."""
    env = H.subprocess_env(XLA_FLAGS=flags)
    r = subprocess.run([sys.executable, *_tool("ptdp_jax.cli.train"), "--print-config"],
                       cwd=H.REPO, capture_output=True, text=True, timeout=300, env=env)
    _clean(r, ExitCode.CONFIG)
    word = flags.split()[-1]
    assert r.stderr == (f"ptdp-train: error: XLA_FLAGS: {word!r}: the number of CPU devices "
                        f"must be a whole number >= 1, e.g. "
                        f"--xla_force_host_platform_device_count=8\n"), r.stderr


# ----------------------------------------------------------------------------- smaller ones

def test_mismatch_message_compares_resolved_values(trained):
    """A GPT checkpoint against a LLaMA config of the same seq_len: model.seq_len is not
    named (it was 'checkpoint 16, config None'); a different one is, with both values."""
    from ptdp_jax.checkpoint.format import CheckpointError, check_compatible, read_meta
    from ptdp_jax.config.load import load_config
    meta = read_meta(trained[0] / "2")
    for seq_len, named in ((16, False), (32, True)):
        cfg = load_config("configs/tiny-llama.yaml", {"model.num_layers": 2,
                                                      "model.seq_len": seq_len})
        with pytest.raises(CheckpointError) as e:
            check_compatible(meta, cfg, "ck")
        assert "model.arch: checkpoint gpt, config llama" in str(e.value)
        assert "None" not in str(e.value) and "(none)" not in str(e.value)
        assert ("model.seq_len: checkpoint 16, config 32" in str(e.value)) == named


def test_generate_refuses_a_tokenizer_of_another_vocabulary(trained_bpe, capsys):
    """--tokenizer byte on a model of BPE data printed the prompt alone (the byte decoder
    drops ids >= 256): refused with both sizes; the default is the data's tokenizer."""
    from ptdp_jax.data import TokenDataset
    from ptdp_jax.cli.generate import main
    ckpt, prefix = trained_bpe
    args = [str(ckpt), "--prompt", "Some text", "--max-new-tokens", "4"]
    assert main(args + ["--tokenizer", "byte"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "tokenizer 'byte' has 257 ids but the model was trained with" in err
    ids = TokenDataset(prefix).vocab_size                   # up to 300: what the text gave
    assert f"{prefix}.tokenizer.json' ({ids} ids" in err and "drop --tokenizer" in err
    assert main(args) == ExitCode.OK
    assert capsys.readouterr().out.startswith("Some text")


def test_vocab_size_follows_the_data(trained_bpe, tmp_path):
    """model.vocab_size unset: the data's tokenizer's (the BPE model above trained with
    it); set in the file or the overrides: kept, and too small for the data an error."""
    from ptdp_jax.checkpoint.manager import checkpoint_config
    from ptdp_jax.config.load import load_config
    from ptdp_jax.data import TokenDataset
    from ptdp_jax.run.feed import open_streams
    ckpt, prefix = trained_bpe
    ids = TokenDataset(prefix).vocab_size
    assert ids > 257 and checkpoint_config(ckpt / "1").model.vocab_size == ids
    assert load_config(overrides={"data.path": str(prefix)}).model.vocab_size == ids
    assert load_config(overrides={}).model.vocab_size == 257             # embedded corpus
    (tmp_path / "c.yaml").write_text(f"model:\n  vocab_size: 512\ndata:\n  path: [{prefix}]\n")
    assert load_config(tmp_path / "c.yaml").model.vocab_size == 512
    small = load_config("configs/tiny-gpt.yaml", {"data.path": str(prefix)})
    assert small.model.vocab_size == 257                                 # the file sets it
    with pytest.raises(ConfigError, match=f"vocabulary {ids} but model.vocab_size=257"):
        open_streams(small)
