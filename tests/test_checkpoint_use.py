"""A checkpoint used away from its run: relative paths saved absolute, the tokenizer kept in
the checkpoint (eval, generate and export from another directory, after the data moved),
evaluation on a mesh the training layout does not fit, and the Python loading API."""
import os
import shutil

import pytest

import helpers_ckpt as H
from ptdp_jax.exits import ExitCode

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    """A tiny GPT trained 1 step on BPE data, with relative data.path, checkpoint.dir and
    run.dir, on mesh (1, 2, 1) with the interleaved schedule (v = 2): 4 layers, 4 chunks."""
    from ptdp_jax.data import prepare_dataset
    from ptdp_jax.run.loop import train
    work = tmp_path_factory.mktemp("work")
    (work / "a.txt").write_text("Some text for a tokenizer to learn from. " * 200)
    here = os.getcwd()
    os.chdir(work)
    try:
        prepare_dataset(["a.txt"], "data/bpe", tokenizer="bpe", bpe_vocab_size=300)
        ov = H.tiny(work, data_cache, **{
            "train.steps": 1, "data.path": "data/bpe", "checkpoint.dir": "ckpt",
            "run.dir": "run", "parallel.schedule": "interleaved",
            "parallel.virtual_stages": 2})
        train(mesh_shape=(1, 2, 1), overrides=ov, log=H.Log(), return_params=False)
    finally:
        os.chdir(here)
    return work


def test_saved_config_names_the_data_absolutely(trained):
    """The checkpoint's config and run.dir's config-<id>.yaml hold data.path as an absolute
    path; the step directory keeps the data's tokenizer.json."""
    from ptdp_jax.checkpoint.manager import checkpoint_config, checkpoint_tokenizer, read_meta
    prefix = str(trained / "data" / "bpe")
    assert checkpoint_config(trained / "ckpt" / "1").data.path == (prefix,)
    meta = read_meta(trained / "ckpt" / "1")
    assert meta["data"]["paths"] == [prefix]
    assert meta["tokenizer"]["source"] == f"{prefix}.tokenizer.json"
    [saved] = (trained / "run").glob("config-*.yaml")
    assert f"- {prefix}\n" in saved.read_text()
    spec, name = checkpoint_tokenizer(trained / "ckpt")
    assert spec == str(trained / "ckpt" / "1" / "tokenizer" / "tokenizer.json")
    assert name == f"{prefix}.tokenizer.json"
    assert open(spec).read() == open(name).read()


def test_tools_work_from_another_directory_and_after_the_data_moved(trained, tmp_path,
                                                                   monkeypatch, capsys):
    """ptdp-eval from another directory finds the data; once the data has moved,
    ptdp-generate and ptdp-export still decode with the tokenizer the checkpoint keeps (the
    export's tokenizer.json is the data's), and ptdp-eval names the missing data."""
    from ptdp_jax.run import evaluate as EV
    from ptdp_jax.cli import eval as eval_cli
    from ptdp_jax.interop import export as EX
    from ptdp_jax.run import generate as GE
    from ptdp_jax.cli import generate as generate_cli
    from ptdp_jax.data import BPETokenizer
    monkeypatch.chdir(tmp_path)
    ckpt = str(trained / "ckpt")
    out = EV.evaluate_checkpoint(ckpt, mesh="1,2,1")
    assert out["step"] == 1 and out["loss"] > 0
    tok_text = (trained / "data" / "bpe.tokenizer.json").read_text()
    moved = tmp_path / "moved"
    shutil.move(trained / "data", moved)
    try:
        args = [ckpt, "--prompt", "Some text", "--max-new-tokens", "3"]
        assert generate_cli.main(args) == ExitCode.OK
        assert capsys.readouterr().out.startswith("Some text")
        assert generate_cli.main(args + ["--tokenizer", "byte"]) == ExitCode.CONFIG
        err = capsys.readouterr().err
        assert "trained with" in err and "bpe.tokenizer.json" in err and "kept in the" in err
        hf = EX.export_checkpoint(ckpt, tmp_path / "hf")
        assert (hf / "tokenizer.json").read_text() == tok_text
        ids = BPETokenizer.from_file(hf / "tokenizer.json").encode("Some text")
        assert ids == BPETokenizer.from_file(moved / "bpe.tokenizer.json").encode("Some text")
        assert eval_cli.main([ckpt]) == ExitCode.CONFIG
        assert "data/bpe" in capsys.readouterr().err
        assert eval_cli.main([ckpt, f"data.path={moved / 'bpe'}"]) == ExitCode.OK
    finally:
        shutil.move(moved, trained / "data")


def test_tools_read_the_parameters_only(trained, tmp_path, capsys):
    """The AdamW moments of a checkpoint damaged (their array data overwritten): reading the
    whole state fails, so the damage is real; ptdp-eval (to the loss of the intact copy),
    ptdp-generate, ptdp-export and ptdp_jax.load read the parameters alone and still work."""
    import ptdp_jax
    from ptdp_jax.checkpoint.manager import CheckpointError, load_checkpoint, load_params
    from ptdp_jax.cli import eval as eval_cli, export as export_cli, generate as generate_cli
    from ptdp_jax.run import evaluate as EV
    copy = tmp_path / "ckpt"
    shutil.copytree(trained / "ckpt", copy)
    assert H.damage_moments(copy / "1") >= 10
    with pytest.raises(CheckpointError, match=r"corrupt or incomplete .*opt\."):
        load_checkpoint(copy)
    assert H.trees_equal(load_params(copy)[1], load_params(trained / "ckpt")[1])
    assert EV.evaluate_checkpoint(copy)["loss"] == EV.evaluate_checkpoint(trained / "ckpt")["loss"]
    assert eval_cli.main([str(copy)]) == ExitCode.OK
    assert generate_cli.main([str(copy), "--prompt", "Some", "--max-new-tokens", "2"]) == \
        ExitCode.OK
    assert export_cli.main([str(copy), str(tmp_path / "hf")]) == ExitCode.OK
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert ptdp_jax.load(copy).step == 1
    assert "error" not in capsys.readouterr().err


def test_byte_tokenizer_is_a_marker(tmp_path, data_cache):
    """The embedded corpus (byte tokenizer): the metadata says 'byte', no file is kept."""
    from ptdp_jax.checkpoint.manager import checkpoint_tokenizer, read_meta
    from ptdp_jax.run.loop import train
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 1, "model.num_layers": 1})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log(), return_params=False)
    assert read_meta(tmp_path / "ckpt" / "1")["tokenizer"] == "byte"
    assert not (tmp_path / "ckpt" / "1" / "tokenizer").exists()
    assert checkpoint_tokenizer(tmp_path / "ckpt") == ("byte", "byte")


def test_eval_picks_a_layout_that_fits_the_mesh(trained, capsys):
    """The training run's interleaved v = 2 (4 layers, pipe 2) cannot split over pipe 4:
    ptdp-eval --mesh 1,4,2 evaluates with 1f1b, v = 1 (saying so), to the loss of the
    training layout; layout keys given on the command line are kept (and refused if they
    do not fit)."""
    from ptdp_jax.run import evaluate as EV
    from ptdp_jax.cli import eval as eval_cli
    from ptdp_jax.config.load import ConfigError
    ckpt = str(trained / "ckpt")
    same = EV.evaluate_checkpoint(ckpt, mesh="1,2,1")
    assert same["layout"] is None
    other = EV.evaluate_checkpoint(ckpt, mesh="1,4,2")
    assert other["layout"].startswith("schedule 1f1b, virtual_stages 1")
    assert "interleaved, virtual_stages 2" in other["layout"]
    assert abs(other["loss"] - same["loss"]) < 1e-4 * same["loss"]
    assert eval_cli.main([ckpt, "--mesh", "1,4,2"]) == ExitCode.OK
    assert "ptdp-eval: evaluating with schedule 1f1b" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="model.num_layers=4 is not divisible"):
        EV.evaluate_checkpoint(ckpt, mesh="1,4,2", overrides={"parallel.schedule": "interleaved",
                                                         "parallel.virtual_stages": 2})


@pytest.mark.parametrize("keys,named", [
    (["train.steps=5"], "train.steps"),
    (["train.eval_batches=1", "checkpoint.dir=x", "run.dir=y"], "checkpoint.dir, run.dir"),
    (["model.hidden_size=64"], "model.hidden_size"),
])
def test_eval_refuses_keys_it_does_not_take(trained, capsys, keys, named):
    """ptdp-eval's overrides are data.*, train.eval_batches, train.micro_batch_size,
    train.dtype and parallel.*: any other key is a one-line config error naming it (exit 2)."""
    from ptdp_jax.cli import eval as eval_cli
    assert eval_cli.main([str(trained / "ckpt"), *keys]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ptdp-eval: config error: {named}: "), err
    if not named.startswith("model."):
        assert ("data.*, train.eval_batches, train.micro_batch_size, train.dtype, parallel.*"
                in err), err


def test_load_api_logits_and_generate(trained):
    """ptdp_jax.load: the logits of the model on one device are those of its parameters; on
    a mesh the training layout fits (2, 2, 2) and one it does not (1, 4, 2) they agree;
    generate is the tokens ptdp-generate's function picks, on one device and on a mesh."""
    import jax
    import numpy as np

    import ptdp_jax
    from ptdp_jax.checkpoint.manager import load_params
    from ptdp_jax.run.generate import generate
    from ptdp_jax.models import model as M
    from ptdp_jax.parallel.sharding import Sharder
    ckpt = trained / "ckpt"
    cfg, params = load_params(ckpt)
    mc = cfg.model
    tokens = np.random.default_rng(0).integers(0, mc.vocab_size, (3, mc.seq_len))
    sh, p = Sharder(), jax.tree.map(jax.numpy.asarray, params)
    want = np.asarray(M.logits(mc, sh, p["embed"], p["head"], M.run_layers(
        mc, sh, p["layers"], M.embed(mc, sh, p["embed"], tokens))))[..., :mc.vocab_size]
    one = ptdp_jax.load(ckpt)
    assert isinstance(one, ptdp_jax.Model) and one.step == 1 and one.mesh is None
    np.testing.assert_allclose(one.logits(tokens), want, rtol=1e-5, atol=1e-5)
    assert one.logits(tokens[0, :5]).shape == (1, 5, mc.vocab_size)
    prompt = one.tokenizer.encode("Some text")
    greedy = one.generate(prompt, 4)
    assert greedy == generate(mc, params, prompt, 4)
    for shape, schedule in [((2, 2, 2), "interleaved"), ((1, 4, 2), "1f1b")]:
        model = ptdp_jax.load(ckpt, mesh_shape=shape)
        assert model.layout.parallel.schedule == schedule, shape
        np.testing.assert_allclose(model.logits(tokens), want, rtol=1e-4, atol=1e-4)
        assert model.generate(prompt, 4) == greedy, shape
    sampled = one.generate(prompt, 3, temperature=0.8, top_k=5, seed=1)
    assert sampled == generate(mc, params, prompt, 3, temperature=0.8, top_k=5, seed=1)
    with pytest.raises(ValueError, match="1 <= n <= model.seq_len=16"):
        one.logits(np.zeros((1, 17), np.int32))


def test_load_is_imported_on_first_use():
    """`import ptdp_jax` does not import the loading API; `ptdp_jax.load` does."""
    import subprocess
    import sys
    code = ("import sys, ptdp_jax; assert 'ptdp_jax.run.inference' not in sys.modules; "
            "assert ptdp_jax.load.__module__ == 'ptdp_jax.run.inference'")
    r = subprocess.run([sys.executable, "-c", code], cwd=H.REPO, capture_output=True,
                       text=True, timeout=120, env=H.subprocess_env(JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr
