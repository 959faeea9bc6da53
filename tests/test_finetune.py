"""Fine-tuning and resuming: checkpoint.load_weights (a run that starts from another
checkpoint's or a Hugging Face folder's parameters, at step 0 with a fresh optimizer, on any
mesh) and its refusals; checkpoint.resume_step; data.val_path in training and ptdp-eval; what
a resume says and keeps (config files, changed settings); ptdp-train --version."""
import jax
import numpy as np
import pytest

import helpers_ckpt as H
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.cli.train import main as cli_main
from ptdp_jax.config.load import ConfigError
from ptdp_jax.exits import ExitCode
from ptdp_jax.run.loop import resolve_config, train

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def source(tmp_path_factory, data_cache):
    """A tiny GPT trained 2 steps on (1, 1, 1): (folder, overrides); its checkpoint in
    folder/ckpt, its ptdp-export in folder/hf."""
    from ptdp_jax.interop.export import export_checkpoint
    d = tmp_path_factory.mktemp("source")
    ov = H.tiny(d, data_cache, **{"train.steps": 2, "model.num_layers": 2})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log(), return_params=False)
    export_checkpoint(d / "ckpt", d / "hf")
    return d, ov


def _first_loss(params, ov) -> float:
    """The loss of canonical `params` on the batch of step 0, computed on one device."""
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.run.feed import Feed
    from ptdp_jax.training.evaluate import make_eval_fn
    from ptdp_jax.training.state import stage_params
    cfg = resolve_config(None, (1, 1, 1), {**ov, "checkpoint.dir": ""})
    mesh = make_mesh((1, 1, 1))
    batch = Feed(cfg, mesh).batch(0)
    return float(jax.jit(make_eval_fn(cfg, mesh))(stage_params(cfg, params), batch))


def _adam_counts(state) -> list[int]:
    return [int(x) for path, x in jax.tree_util.tree_leaves_with_path(state["opt"])
            if "count" in jax.tree_util.keystr(path)]


@pytest.mark.parametrize("kind", ["checkpoint", "hf"])
def test_load_weights_starts_from_those_parameters(source, tmp_path, kind):
    """A run with checkpoint.load_weights (the source's checkpoint.dir, or its ptdp-export)
    on mesh (2, 2, 1): its first loss is that of the source's parameters computed directly,
    it starts at step 0, and its checkpoint after one step holds a fresh optimizer's count
    (1, where the source's moments had 2); a second run of it resumes from its own
    checkpoint.dir, saying in one line that load_weights is ignored."""
    d, ov = source
    _, params = CK.load_params(d / "ckpt")
    _, _, source_meta = CK.load_checkpoint(d / "ckpt")
    ft = {**ov, "train.steps": 1, "run.dir": str(tmp_path / "run"),
          "checkpoint.dir": str(tmp_path / "ft"),
          "checkpoint.load_weights": str(d / ("ckpt" if kind == "checkpoint" else "hf"))}
    log = H.Log()
    res = train(mesh_shape=(2, 2, 1), overrides=ft, log=log)
    assert res.start_step == 0 and len(res.losses) == 1
    want = _first_loss(params, ov)
    assert abs(res.losses[0] - want) <= 2e-6 * want, (res.losses[0], want)
    assert abs(res.losses[0] - _first_loss(_fresh_params(ov), ov)) > 1e-3
    assert "checkpoint.load_weights: starting at step 0 from the parameters of" in log.text
    _, state, meta = CK.load_checkpoint(tmp_path / "ft")
    assert meta["step"] == 1 and set(_adam_counts(state)) == {1}
    assert set(_adam_counts(CK.load_checkpoint(d / "ckpt")[1])) == {2} and source_meta["step"] == 2
    again = H.Log()
    res = train(mesh_shape=(2, 2, 1), overrides=ft, log=again)
    assert res.start_step == 1
    lines = [ln for ln in again.lines if ln.startswith("checkpoint.load_weights")]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line == f"checkpoint.load_weights={ft['checkpoint.load_weights']} ignored: the run " \
                   f"resumes from its checkpoint.dir"


def _fresh_params(ov):
    from ptdp_jax.models import model as M
    cfg = resolve_config(None, (1, 1, 1), ov)
    return jax.tree.map(np.asarray, M.init_params(cfg.model, cfg.train.seed))


@pytest.mark.parametrize("case,code,words", [
    ("missing", ExitCode.CONFIG, ["checkpoint.load_weights=", "does not exist"]),
    ("not_a_model", ExitCode.CONFIG, ["is neither a ptdp_jax checkpoint", "Hugging Face"]),
    ("other_model", ExitCode.CHECKPOINT, ["checkpoint.load_weights=", "is of a different model",
                                          "model.num_layers: checkpoint 2, config 4"]),
    ("other_hf_model", ExitCode.CHECKPOINT, ["checkpoint.load_weights=", "hf is of a different",
                                             "model.hidden_size: checkpoint 32, config 64"]),
    ("other_norm_eps", ExitCode.CHECKPOINT, ["model.norm_eps: checkpoint 1e-05, config 1e-06"]),
    ("bad_hf_tensors", ExitCode.CHECKPOINT, ["model.safetensors cannot be read as safetensors"]),
])
def test_load_weights_refusals_are_one_line_before_compiling(source, tmp_path, capsys, case,
                                                              code, words):
    """A load_weights path that is missing, not a model, of another model (a ptdp_jax or a
    Hugging Face one; another norm epsilon too) or whose tensor file is damaged: ptdp-train
    refuses it in one line naming the key, before compiling."""
    import shutil
    d, ov = source
    ft = {**ov, "run.dir": str(tmp_path / "run"), "checkpoint.dir": str(tmp_path / "ft"),
          "checkpoint.load_weights": str(d / "ckpt")}
    if case == "missing":
        ft["checkpoint.load_weights"] = str(tmp_path / "nothing")
    elif case == "not_a_model":
        (tmp_path / "notes").mkdir()
        ft["checkpoint.load_weights"] = str(tmp_path / "notes")
    elif case == "other_model":
        ft["model.num_layers"] = 4
    elif case == "other_hf_model":
        ft.update({"checkpoint.load_weights": str(d / "hf"), "model.hidden_size": 64})
    elif case == "other_norm_eps":
        ft["model.norm_eps"] = 1e-6
    else:
        shutil.copytree(d / "hf", tmp_path / "hf")
        tensors = tmp_path / "hf" / "model.safetensors"
        tensors.write_bytes(tensors.read_bytes()[:40])
        ft["checkpoint.load_weights"] = str(tmp_path / "hf")
    rc = cli_main(["--mesh", "1,1,1"] + [f"{k}={v}" for k, v in ft.items()])
    out = capsys.readouterr()
    assert rc == code, out.err
    assert out.err.count("\n") == 1, out.err
    assert all(w in out.err for w in words), out.err
    assert "compiling" not in out.out + out.err
    assert not (tmp_path / "ft").exists() or not CK.resume_from(resolve_config(None, None, ft))


def test_load_weights_needs_the_data_of_its_tokenizer(source, tmp_path):
    """Data of another tokenizer than the source's bytes (a BPE of as many ids: 257, whose ids
    mean other text): refused, naming both."""
    from ptdp_jax.data import prepare_dataset
    d, ov = source
    (tmp_path / "a.txt").write_text("Other text for another tokenizer. " * 200)
    prepare_dataset([str(tmp_path / "a.txt")], tmp_path / "bpe", tokenizer="bpe",
                    bpe_vocab_size=257)
    ft = {**ov, "run.dir": str(tmp_path / "run"), "checkpoint.dir": "",
          "checkpoint.load_weights": str(d / "ckpt"), "data.path": str(tmp_path / "bpe")}
    with pytest.raises(CK.CheckpointError, match=r"checkpoint.load_weights=.*token ids of "
                                                 r"tokenizer 'byte'.*bpe"):
        train(mesh_shape=(1, 1, 1), overrides=ft, log=H.Log())
    with pytest.raises(ConfigError, match="does not exist"):
        train(mesh_shape=(1, 1, 1), overrides={**ft, "checkpoint.load_weights": "nowhere"},
              log=H.Log())


# ----------------------------------------------------------------------------- resume_step

def test_resume_step_resumes_from_an_older_checkpoint(tmp_path, data_cache):
    """Checkpoints of steps 1-4; checkpoint.resume_step=2 is refused naming the later steps 3
    and 4 (kept untouched), and a step that is not there naming those that are; with
    checkpoint.resume=overwrite the run resumes at step 2, its losses those of the first run's
    steps 3 and 4 bit for bit, says that 3 and 4 go at its first save, and leaves its own."""
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 4, "checkpoint.every": 1,
                                         "checkpoint.keep": 4, "model.num_layers": 2})
    base = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    ckpt = tmp_path / "ckpt"
    before = H.snapshot(ckpt)
    with pytest.raises(ConfigError, match=r"checkpoint.resume_step=2: .* holds later checkpoints "
                                          r"\(steps 3, 4\).*add checkpoint.resume=overwrite"):
        train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.resume_step": 2}, log=H.Log())
    with pytest.raises(ConfigError, match=r"checkpoint.resume_step=7: .* holds no checkpoint of "
                                          r"step 7; it holds steps 1, 2, 3, 4$"):
        train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.resume_step": 7}, log=H.Log())
    assert H.snapshot(ckpt) == before
    old_time = CK.read_meta(ckpt / "4")["time"]
    log = H.Log()
    res = train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.resume_step": 2,
                                                 "checkpoint.resume": "overwrite"}, log=log)
    assert res.start_step == 2 and res.losses == base.losses[2:]
    assert f"resumed from {ckpt} at step 2" in log.text
    assert (f"checkpoint.resume=overwrite: the checkpoints after step 2 in {ckpt} (steps 3, 4) "
            f"are removed at this run's first save") in log.text
    assert sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) == [1, 2, 3, 4]
    assert CK.read_meta(ckpt / "4")["time"] > old_time


def test_later_checkpoints_stay_until_the_first_save(tmp_path, data_cache):
    """The manager of a run resumed from step 2 with checkpoint.resume=overwrite keeps the
    later checkpoints 3 and 4 until it saves: then they go, and its own step 3 is written;
    without overwrite the save refuses (the run was refused before compiling)."""
    import jax.numpy as jnp
    from dataclasses import replace

    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import make_optimizer
    from ptdp_jax.training.step import compile_all
    ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2, "checkpoint.keep": 4})
    cfg = resolve_config(None, (1, 1, 1), ov)
    compiled = compile_all(cfg, make_mesh((1, 1, 1)), make_optimizer(cfg)[0])
    state = compiled.init()
    with CK.CheckpointManager.from_config(cfg, compiled.shardings) as m:
        for s in (1, 2, 3, 4):
            m.save(s, dict(state, step=jnp.int32(s)))
    strict = replace(cfg, checkpoint=replace(cfg.checkpoint, resume_step=2))
    m = CK.CheckpointManager.from_config(strict, compiled.shardings)
    restored = m.restore(2)
    with pytest.raises(CK.ResumeStepRefused, match=r"later checkpoints \(steps 3, 4\)"):
        m.save(3, restored)
    m.close()
    over = replace(cfg, checkpoint=replace(cfg.checkpoint, resume_step=2, resume="overwrite"))
    with CK.CheckpointManager.from_config(over, compiled.shardings) as m:
        restored = m.restore(2)
        assert m.steps() == [1, 2, 3, 4]
        m.save(3, dict(restored, step=jnp.int32(3)))
        m.wait()
        assert m.steps() == [1, 2, 3]


@pytest.mark.parametrize("extra,words", [
    ({"checkpoint.resume_step": 2, "checkpoint.resume": False},
     "checkpoint.resume_step=2 resumes from that checkpoint and checkpoint.resume=false starts "
     "fresh: drop one of them"),
    ({"checkpoint.resume_step": 2, "checkpoint.dir": ""},
     "checkpoint.resume_step=2 resumes from a checkpoint of checkpoint.dir, which is not set"),
    ({"checkpoint.resume_step": -1}, "checkpoint.resume_step must be >= 0, got -1"),
])
def test_resume_step_settings_that_contradict(tmp_path, data_cache, extra, words):
    from ptdp_jax.run.loop import resolved_config
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        resolved_config(None, (1, 1, 1), {**H.tiny(tmp_path, data_cache), **extra})


# ----------------------------------------------------------------------------- data.val_path

def test_val_path_in_training_and_in_ptdp_eval(tmp_path, data_cache, capsys):
    """A run with data.val_path evaluates on that set: its last validation loss is the one
    ptdp-eval gives its checkpoint (whose saved config names the set), on another mesh too;
    without it (data.val_path=[]) ptdp-eval evaluates data.path's held-out split, another
    loss; ptdp-eval takes data.val_path on its command line."""
    from ptdp_jax.cli import eval as eval_cli
    from ptdp_jax.data import prepare_dataset
    from ptdp_jax.run.evaluate import evaluate_checkpoint
    (tmp_path / "val.txt").write_text("A validation text of its own, not the training one. " * 40)
    val = prepare_dataset([tmp_path / "val.txt"], tmp_path / "val")
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2, "model.num_layers": 2,
                                         "data.val_path": str(val)})
    res = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    step, loss = res.val_losses[-1]
    assert step == 2
    assert CK.checkpoint_config(tmp_path / "ckpt" / "2").data.val_path == (str(val),)
    for mesh in (None, "2,1,2"):
        got = evaluate_checkpoint(tmp_path / "ckpt", mesh=mesh)["loss"]
        assert abs(got - loss) <= 1e-5 * loss, (mesh, got, loss)
    split = evaluate_checkpoint(tmp_path / "ckpt", overrides={"data.val_path": []})["loss"]
    assert abs(split - loss) > 1e-3
    assert eval_cli.main([str(tmp_path / "ckpt"), f"data.val_path={val}"]) == ExitCode.OK
    assert f"val loss {loss:.4f}" in capsys.readouterr().out


def test_ptdp_eval_with_val_path_needs_no_training_data(tmp_path, data_cache):
    """ptdp-eval given data.val_path reads only that set: the training data can be gone
    (evaluated on another machine), and the loss is the run's own on that set."""
    from ptdp_jax.data import prepare_dataset
    from ptdp_jax.run.evaluate import evaluate_checkpoint
    (tmp_path / "train.txt").write_text("Some training text for a tiny model to read. " * 80)
    (tmp_path / "val.txt").write_text("A validation text of its own, not the training one. " * 40)
    data = prepare_dataset([tmp_path / "train.txt"], tmp_path / "train")
    val = prepare_dataset([tmp_path / "val.txt"], tmp_path / "val")
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2, "model.num_layers": 2,
                                         "data.path": str(data), "data.val_path": str(val)})
    loss = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log()).val_losses[-1][1]
    for f in tmp_path.glob("train.*"):
        f.unlink()
    got = evaluate_checkpoint(tmp_path / "ckpt")["loss"]
    assert abs(got - loss) <= 1e-5 * loss


# ----------------------------------------------------------------------------- resuming, said

def test_each_resume_keeps_its_config_and_names_changed_settings(tmp_path, data_cache):
    """A run stopped at step 1, resumed with another train.lr, train.seed and
    train.global_batch_size, then resumed again as it was: run.dir keeps config-<id>.yaml,
    config-<id>-1.yaml and config-<id>-1-2.yaml, each its own start's config; the first
    resume names the three settings in one line, the second says nothing of them."""
    import yaml
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2, "model.num_layers": 2,
                                         "train.stop_at_step": 1})
    first = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    changed = {**ov, "train.lr": 1e-3, "train.seed": 1, "train.global_batch_size": 16}
    log = H.Log()
    assert train(mesh_shape=(1, 1, 1), overrides=changed, log=log).start_step == 1
    notes = [ln for ln in log.lines if ln.startswith("note: ")]
    assert notes == ["note: resumed with settings other than the checkpoint's: "
                     "train.global_batch_size 8 -> 16, train.seed 0 -> 1, train.lr 0.003 -> 0.001 "
                     "(from step 1 on: batches of another size (other samples from here); another "
                     "data order and other dropout masks; another learning-rate schedule)"], notes
    again = H.Log()
    train(mesh_shape=(1, 1, 1), overrides=ov, log=again)
    assert not [ln for ln in again.lines if ln.startswith("note: ")]
    run = tmp_path / "run"
    names = sorted(p.name for p in run.glob("config-*.yaml"))
    rid = first.run_id
    assert names == [f"config-{rid}-1-2.yaml", f"config-{rid}-1.yaml", f"config-{rid}.yaml"]
    lr = lambda name: yaml.safe_load((run / name).read_text())["train"]["lr"]
    assert [lr(f"config-{rid}.yaml"), lr(f"config-{rid}-1.yaml"), lr(f"config-{rid}-1-2.yaml")] \
        == [3e-3, 1e-3, 3e-3]


def test_version(capsys):
    """ptdp-train --version prints ptdp_jax's version and jax's, and exits 0."""
    import jaxlib

    import ptdp_jax
    with pytest.raises(SystemExit) as e:
        cli_main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == (f"ptdp_jax {ptdp_jax.__version__}, jax {jax.__version__} "
                                       f"(jaxlib {jaxlib.__version__})\n")
