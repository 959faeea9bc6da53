"""Every path a `ptdp-*` command reads or writes, when it cannot be used, ends the command with
one line on stderr naming the path and why (exit 2; 6 for a checkpoint), never a traceback:
a file where a folder should be, a missing parent (read: refused; written: made), a read-only
folder (a read-only tmpfs where `mount` works, else `os.access` says so, as it does on one).
Also: ptdp-schedule's --out format, and a stdout closed by its reader (`| head -1`)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import pytest

import helpers_ckpt as H
from ptdp_jax.cli import (eval as eval_cli, export as export_cli, generate as generate_cli,
                          import_hf as import_cli, plan as plan_cli, train as train_cli)
from ptdp_jax.data import prepare
from ptdp_jax.exits import ExitCode
from ptdp_jax.pipeline import plot

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TINY = {"model.num_layers": 2, "model.hidden_size": 32, "model.num_heads": 4,
        "model.seq_len": 16, "train.global_batch_size": 8, "train.micro_batch_size": 1,
        "train.steps": 1, "train.warmup_steps": 1, "train.eval_every": 0,
        "train.sample_tokens": 0}


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_cache):
    """What the commands read: a text file, a token file, a checkpoint and its export."""
    from ptdp_jax.run.loop import train
    root = tmp_path_factory.mktemp("world")
    (root / "in.txt").write_text("a small document. " * 20)
    prepare.prepare_dataset([root / "in.txt"], root / "data")
    train(None, mesh_shape=(1, 1, 1), log=lambda *a, **k: None, return_params=False,
          overrides={**TINY, "run.dir": str(root / "run"), "checkpoint.dir": str(root / "ckpt")})
    assert export_cli.main([str(root / "ckpt"), str(root / "hf")]) == 0
    return root


@dataclass(frozen=True)
class Role:
    """One path of one command: `argv(path, world, tmp)` runs `main` with `path` there (or
    `env` names the variable that holds it)."""
    name: str
    main: Callable
    argv: Callable
    leaf: str                   # the path's last part
    writes: bool
    code: int = ExitCode.CONFIG
    env: str | None = None
    made: bool = False          # written, and a missing parent is made (the command succeeds)
    extra_env: dict = field(default_factory=dict)


def _train(*extra):
    return ["--mesh", "1,1,1", "--dry-run", *[f"{k}={v}" for k, v in TINY.items()], *extra]


def _run(tmp):
    return f"run.dir={tmp / 'run'}"


ROLES = [
    Role("prepare-data INPUT", prepare.main, lambda p, w, t: [str(p), "--out", str(t / "o")],
         "in.txt", writes=False),
    Role("prepare-data --out", prepare.main, lambda p, w, t: [str(w / "in.txt"), "--out", str(p)],
         "corpus", writes=True, made=True),
    Role("prepare-data --tokenizer", prepare.main,
         lambda p, w, t: [str(w / "in.txt"), "--out", str(t / "o"), "--tokenizer", str(p)],
         "tokenizer.json", writes=False),
    Role("schedule --out", plot.main, lambda p, w, t: ["--no-grid", "--out", str(p)], "s.png",
         writes=True),
    Role("export CHECKPOINT", export_cli.main, lambda p, w, t: [str(p), str(t / "hf")], "ckpt",
         writes=False, code=ExitCode.CHECKPOINT),
    Role("export OUT_DIR", export_cli.main, lambda p, w, t: [str(w / "ckpt"), str(p)], "hf",
         writes=True, made=True),
    Role("export --tokenizer", export_cli.main,
         lambda p, w, t: [str(w / "ckpt"), str(t / "hf"), "--tokenizer", str(p)],
         "tokenizer.json", writes=False),
    Role("import-hf HF_DIR", import_cli.main, lambda p, w, t: [str(p), str(t / "imported")],
         "hf", writes=False),
    Role("import-hf CHECKPOINT_DIR", import_cli.main, lambda p, w, t: [str(w / "hf"), str(p)],
         "imported", writes=True, made=True),
    Role("eval CHECKPOINT", eval_cli.main, lambda p, w, t: [str(p)], "ckpt", writes=False,
         code=ExitCode.CHECKPOINT),
    Role("eval data.path", eval_cli.main, lambda p, w, t: [str(w / "ckpt"), f"data.path={p}"],
         "data", writes=False),
    Role("generate --tokenizer", generate_cli.main,
         lambda p, w, t: [str(w / "ckpt"), "--prompt", "a", "--tokenizer", str(p)],
         "tokenizer.json", writes=False),
    Role("plan CONFIG", plan_cli.main, lambda p, w, t: [str(p), "--gpus", "8"], "c.yaml",
         writes=False),
    Role("train CONFIG", train_cli.main, lambda p, w, t: [str(p), *_train(_run(t))], "c.yaml",
         writes=False),
    Role("train data.path", train_cli.main,
         lambda p, w, t: _train(_run(t), f"data.path={p}"), "data", writes=False),
    Role("train run.dir", train_cli.main, lambda p, w, t: _train(f"run.dir={p}"), "run",
         writes=True),
    Role("train checkpoint.dir", train_cli.main,
         lambda p, w, t: _train(_run(t), f"checkpoint.dir={p}"), "ckpt", writes=True,
         code=ExitCode.CHECKPOINT),
    Role("train run.compile_cache", train_cli.main,
         lambda p, w, t: _train(_run(t), f"run.compile_cache={p}"), "xla", writes=True),
    Role("train $PTDP_CACHE_DIR", train_cli.main, lambda p, w, t: _train(_run(t)), "cache",
         writes=True, env="PTDP_CACHE_DIR"),
    Role("train $HOME (run.compile_cache=auto)", train_cli.main,
         lambda p, w, t: _train(_run(t)), "home", writes=True, env="HOME"),
]

KINDS = ("below-a-file", "missing-parent", "read-only")
CASES = [(r, k) for r in ROLES for k in KINDS
         if (k != "read-only" or r.writes)                  # reading a read-only place is fine
         and not (k == "missing-parent" and r.writes and r.main is train_cli.main)]
# (train's folders are made where missing: the run would then train)


def _mount_read_only(folder: Path) -> bool:
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "ptdp-test",
                               str(folder)], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder no file can be made in: a read-only tmpfs mounted there if `mount` works,
    else one that `os.access` (as on a read-only mount) calls unwritable."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = _mount_read_only(folder)
    if not mounted:
        real = os.access

        def access(path, mode, *args, **kwargs):
            inside = Path(os.path.abspath(path)).is_relative_to(folder)
            return False if inside and mode & os.W_OK else real(path, mode, *args, **kwargs)
        monkeypatch.setattr(os, "access", access)
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], capture_output=True, timeout=30)


def _place(kind: str, tmp: Path, request) -> tuple[Path, Path]:
    """(the folder the path goes in, the part of it the message must name)."""
    if kind == "below-a-file":
        (tmp / "afile").write_text("x")
        return tmp / "afile", tmp / "afile"
    if kind == "missing-parent":
        return tmp / "nodir" / "sub", tmp / "nodir"
    ro = request.getfixturevalue("read_only")
    return ro, ro


@pytest.mark.parametrize("role,kind", CASES, ids=[f"{r.name}-{k}" for r, k in CASES])
def test_a_path_that_cannot_be_used_is_one_line(role, kind, world, tmp_path, monkeypatch,
                                                capsys, request):
    folder, named = _place(kind, tmp_path, request)
    path = folder / role.leaf
    if role.env:
        monkeypatch.setenv(role.env, str(path))
    if role.env == "HOME":             # the compilation cache's default, not one set earlier
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
        before = jax.config.jax_compilation_cache_dir
        jax.config.update("jax_compilation_cache_dir", None)
        request.addfinalizer(lambda: jax.config.update("jax_compilation_cache_dir", before))
    monkeypatch.chdir(tmp_path)
    try:
        rc = role.main(role.argv(path, world, tmp_path))
    except SystemExit as e:                      # argparse's parser.exit
        rc = e.code
    err = capsys.readouterr().err
    if kind == "missing-parent" and role.made:
        assert rc == ExitCode.OK and path.parent.is_dir(), (rc, err)
        return
    assert rc == role.code, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "[Errno" not in err, err      # in words
    assert str(named) in err, err


def test_schedule_refuses_a_format_it_cannot_write(tmp_path, capsys):
    """--out x.txt: one line naming the file and the formats, exit 2, nothing printed."""
    with pytest.raises(SystemExit) as stop:
        plot.main(["--out", str(tmp_path / "x.txt")])
    out, err = capsys.readouterr()
    assert stop.value.code == ExitCode.CONFIG and out == "" and err.count("\n") == 1, err
    assert f"--out {tmp_path / 'x.txt'}: unsupported format 'txt'" in err and "png" in err
    assert not list(tmp_path.iterdir())


def test_schedule_reports_the_file_it_wrote(tmp_path, capsys):
    """--out pics/x (no ending) writes pics/x.png and says so."""
    assert plot.main(["--no-grid", "--out", str(tmp_path / "x")]) == 0
    assert f"wrote {tmp_path / 'x.png'}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["x.png"]


@pytest.mark.parametrize("module,args", [
    ("ptdp_jax.pipeline.plot", ["--p", "8", "--m", "64", "--out", "s.png"]),
    ("ptdp_jax.pipeline.plot", ["--no-grid", "--out", "s.png"]),          # flushed at the end
    ("ptdp_jax.data.prepare", ["in.txt", "--out", "corpus"]),
], ids=["schedule-long", "schedule-short", "prepare-data"])
def test_a_closed_stdout_is_no_error(tmp_path, module, args):
    """stdout's reader gone before the command writes (`ptdp-schedule ... | head -1`): exit 0,
    nothing on stderr, the files still written."""
    (tmp_path / "in.txt").write_text("some text")
    read, write = os.pipe()
    os.close(read)
    code = f"import sys; from {module} import main; sys.exit(main({args!r}))"
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300,
                              env=H.subprocess_env(PYTHONPATH=str(H.REPO)))
    finally:
        os.close(write)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    assert any(p.name in ("s.png", "corpus.bin") for p in tmp_path.iterdir())
