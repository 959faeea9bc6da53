"""ptdp-export: a checkpoint as a Hugging Face directory whose logits match ours."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers_ckpt as H
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.cli import export as export_cli, import_hf as import_cli
from ptdp_jax.interop import export as EX
from ptdp_jax.models import model as M
from ptdp_jax.pipeline.balance import chunk_layers
from ptdp_jax.parallel.sharding import Sharder, make_mesh
from ptdp_jax.training.state import make_optimizer
from ptdp_jax.training.step import compile_all
from ptdp_jax.run.loop import resolve_config

try:
    import torch
    import transformers
except ImportError as e:          # CI installs them: pip install torch==2.13.0 transformers
    torch = transformers = None
    _why = f"needs torch and transformers ({e}); pip install torch==2.13.0 transformers"

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
needs_hf = pytest.mark.skipif(transformers is None, reason=_why if transformers is None else "")


def _random_params(cfg, seed=1):
    """Canonical parameters with every tensor random (biases and norm scales too, so a
    transposed or misplaced tensor cannot hide)."""
    shapes = M.param_shapes(cfg.model)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    vals = [np.asarray(0.2 * jax.random.normal(k, s, jnp.float32)) for k, s in zip(keys, leaves)]
    params = jax.tree.unflatten(treedef, vals)
    for g in params.values():
        for name in g:
            if "scale" in name or "norm" in name:
                g[name] = 1.0 + g[name]
    return params


def _our_logits(model_cfg, params, tokens):
    sh = Sharder()
    p = jax.tree.map(jnp.asarray, params)
    x = M.embed(model_cfg, sh, p["embed"], tokens)
    x = M.run_layers(model_cfg, sh, p["layers"], x)
    return np.asarray(M.logits(model_cfg, sh, p["embed"], p["head"], x))


def _checkpoint(tmp_path, arch, mesh=(1, 2, 2), **extra):
    """A checkpoint (written from a pipelined, tensor-parallel layout) of random params."""
    ov = H.tiny(tmp_path, tmp_path / "data", **{
        "model.arch": arch, "model.num_layers": 2, "model.hidden_size": 32,
        "model.num_heads": 4, "model.vocab_size": 300, "model.seq_len": 16,
        "model.rope_theta": 500.0, "model.norm_eps": 1e-6, **extra})
    cfg = resolve_config(None, mesh, ov)
    tx, _ = make_optimizer(cfg)
    compiled = compile_all(cfg, make_mesh(mesh), tx)
    params = _random_params(cfg)
    state = compiled.init()
    stage = dict(params, layers=M.to_stage_layout(params["layers"], chunk_layers(cfg),
                                                  cfg.parallel.pipe))
    state = state.replace(params=jax.device_put(stage, compiled.shardings["params"]),
                          step=jnp.int32(3))
    with CK.CheckpointManager(cfg, compiled.shardings) as m:
        m.save(3, state)
    return cfg, params


GQA = {"model.num_kv_heads": 2}           # 4 query heads, 2 key/value heads


@needs_hf
@pytest.mark.parametrize("arch,hf_class,extra", [("gpt", "GPT2LMHeadModel", {}),
                                                 ("llama", "LlamaForCausalLM", {}),
                                                 ("llama", "LlamaForCausalLM", GQA)],
                         ids=["gpt", "llama", "llama-gqa"])
def test_export_matches_transformers(tmp_path, arch, hf_class, extra, capsys):
    cfg, params = _checkpoint(tmp_path, arch, **extra)
    out = tmp_path / "hf"
    assert export_cli.main([str(tmp_path / "ckpt"), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == [hf_class] and conf["vocab_size"] == 300
    if extra:
        assert conf["num_key_value_heads"] == 2 and conf["num_attention_heads"] == 4

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model.eval()
    assert type(model).__name__ == hf_class
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, (3, cfg.model.seq_len))
    with torch.no_grad():
        theirs = model(torch.tensor(tokens)).logits.numpy()
    ours = _our_logits(cfg.model, params, jnp.asarray(tokens, jnp.int32))[..., :cfg.model.vocab_size]
    assert theirs.shape == ours.shape
    rel = np.abs(theirs - ours).max() / np.abs(ours).max()
    print(f"{arch}: max relative logit difference {rel:.2e}")
    assert rel < 1e-4, rel
    if arch == "gpt":     # tied output layer: not stored twice
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


def test_export_writes_safetensors_without_transformers(tmp_path):
    """The export itself needs only safetensors: names and shapes of the GPT-2 layout."""
    from safetensors.numpy import load_file
    cfg, params = _checkpoint(tmp_path, "gpt", mesh=(1, 1, 1))
    EX.export_checkpoint(tmp_path / "ckpt" / "3", tmp_path / "hf")
    t = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert t["transformer.wte.weight"].shape == (300, 32)              # unpadded from 384
    assert t["transformer.h.1.attn.c_attn.weight"].shape == (32, 96)  # Conv1D (in, out)
    assert "lm_head.weight" not in t                                   # tied
    np.testing.assert_array_equal(t["transformer.h.0.mlp.c_fc.weight"], params["layers"]["fc1_w"][0])


def test_export_rejects_a_non_checkpoint(tmp_path, capsys):
    from ptdp_jax.exits import ExitCode
    (tmp_path / "x").mkdir()
    assert export_cli.main([str(tmp_path / "x"), str(tmp_path / "out")]) == ExitCode.CHECKPOINT
    assert "no complete ptdp_jax checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_checkpoint_or_a_used_folder_as_out(tmp_path, capsys):
    """OUT that is (or is inside) a checkpoint.dir or a step directory, or a folder of other
    files, is refused with one line and exit 2 before anything is written, with --overwrite
    too; --overwrite replaces only an earlier export (it wrote into the checkpoint.dir)."""
    from ptdp_jax.exits import ExitCode
    _checkpoint(tmp_path, "gpt", mesh=(1, 1, 1))
    ckpt = tmp_path / "ckpt"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    before = H.snapshot(tmp_path)
    for out, words in [(ckpt, "is a ptdp_jax checkpoint.dir"), (ckpt / "3", "is a ptdp_jax step"),
                       (ckpt / "hf", "is inside a ptdp_jax checkpoint.dir"),
                       (ckpt / "3" / "hf", "is inside a ptdp_jax step"),
                       (tmp_path / "notes", "not an export (todo.txt)")]:
        for extra in ([], ["--overwrite"]):
            assert export_cli.main([str(ckpt), str(out), *extra]) == ExitCode.CONFIG, (out, extra)
            err = capsys.readouterr().err
            assert words in err and len(err.strip().splitlines()) == 1, err
    assert H.snapshot(tmp_path) == before
    out = tmp_path / "hf"
    from ptdp_jax.checkpoint import lock as LK
    LK.acquire(ckpt)                        # a run training on: a reader takes no lock
    try:
        assert export_cli.main([str(ckpt), str(out)]) == ExitCode.OK
    finally:
        LK.release(ckpt)
    assert export_cli.main([str(ckpt), str(out)]) == ExitCode.CONFIG
    assert "already holds an export" in capsys.readouterr().err
    assert export_cli.main([str(ckpt), str(out), "--overwrite"]) == ExitCode.OK
    (out / "README.md").write_text("mine")
    assert export_cli.main([str(ckpt), str(out), "--overwrite"]) == ExitCode.CONFIG
    assert "not an export (README.md)" in capsys.readouterr().err


def test_damaged_inputs_exit_2_naming_the_file(tmp_path, capsys):
    """A truncated model.safetensors (ptdp-import-hf) and a --tokenizer that is not a
    tokenizer.json (ptdp-export) exit 2 with one line naming the file, not a traceback."""
    from ptdp_jax.exits import ExitCode
    _checkpoint(tmp_path, "gpt", mesh=(1, 1, 1))
    EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5])
    assert import_cli.main([str(tmp_path / "hf"), str(tmp_path / "imported")]) == ExitCode.CONFIG
    assert f"{weights} cannot be read as safetensors" in capsys.readouterr().err
    (tmp_path / "my.yaml").write_text("a: 1\n")
    rc = export_cli.main([str(tmp_path / "ckpt"), str(tmp_path / "hf2"),
                          "--tokenizer", str(tmp_path / "my.yaml")])
    assert rc == ExitCode.CONFIG
    assert "my.yaml is not a tokenizer.json" in capsys.readouterr().err


def test_import_of_no_model_folder_says_what_is_there(tmp_path, capsys):
    """HF_DIR missing (it said "has no config.json"), a file, or a folder without config.json:
    one line each, exit 2, nothing written."""
    from ptdp_jax.exits import ExitCode
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for name, words in (("missing", "does not exist"), ("file", "is not a folder"),
                        ("empty", "has no config.json")):
        rc = import_cli.main([str(tmp_path / name), str(tmp_path / f"out-{name}")])
        err = capsys.readouterr().err
        assert rc == ExitCode.CONFIG and err.count("\n") == 1, err
        assert err.startswith(f"ptdp-import-hf: {tmp_path / name} {words}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file"]


@pytest.mark.parametrize("arch,extra", [("gpt", {}), ("llama", {}), ("llama", GQA)],
                         ids=["gpt", "llama", "llama-gqa"])
def test_import_round_trip(tmp_path, arch, extra, capsys):
    """export -> ptdp-import-hf -> a step-0 checkpoint with the same parameters, which
    restores on another layout."""
    from ptdp_jax.interop import hf_import as HI
    cfg, params = _checkpoint(tmp_path, arch, mesh=(1, 1, 1), **extra)
    EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    model, imported = HI.import_hf(tmp_path / "hf")
    assert model["model.arch"] == arch and model["model.vocab_size"] == 300
    V = cfg.model.vocab_size
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(imported)[0],
                            jax.tree.leaves(params)):
        name = jax.tree_util.keystr(path)
        if "wte" in name or "tok" in name:          # vocabulary rows (padding is zero)
            np.testing.assert_array_equal(a[:V], b[:V]), np.testing.assert_array_equal(a[V:], 0)
        elif "out" in name and "head" in name:
            np.testing.assert_array_equal(a[:, :V], b[:, :V]), np.testing.assert_array_equal(a[:, V:], 0)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)

    if extra:
        assert model["model.num_kv_heads"] == 2
    dest = tmp_path / "imported"
    assert import_cli.main([str(tmp_path / "hf"), str(dest), "model.dropout=0.1"]) == 0
    assert "hidden_size: 32" in (tmp_path / "imported.yaml").read_text()
    assert import_cli.main([str(tmp_path / "hf"), str(dest)]) == 2            # not into a used dir
    c2, state, meta = CK.load_checkpoint(dest)
    assert meta["step"] == 0 and c2.model.dropout == 0.1
    assert c2.model == resolve_config(None, None, {**model, "model.dropout": 0.1}).model
    ov = dict(H.tiny(tmp_path, tmp_path / "data", **model),
              **{"checkpoint.dir": str(dest), "model.dropout": 0.1})
    run_cfg = resolve_config(None, (1, 1, 2), ov)
    m = CK.CheckpointManager(run_cfg, compile_all(run_cfg, make_mesh((1, 1, 2)),
                                                  make_optimizer(run_cfg)[0]).shardings)
    restored, step = m.restore_latest()
    m.close()
    assert step == 0
    got = CK.to_canonical_state(run_cfg, m.tx, jax.device_get(restored))["params"]
    for a, b in zip(jax.tree.leaves(jax.device_get(got)), jax.tree.leaves(imported)):
        np.testing.assert_array_equal(a, b)


def test_import_writes_the_config_that_continues_training(tmp_path, data_cache, capsys,
                                                        monkeypatch):
    """ptdp-import-hf writes CHECKPOINT_DIR.yaml beside the checkpoint and prints the one
    command that trains on from it (no model.* keys to copy); a second import with that
    file in place is refused before anything is written."""
    from ptdp_jax.interop import hf_import as HI
    from ptdp_jax.run.loop import train
    _checkpoint(tmp_path, "llama", mesh=(1, 1, 1), **GQA)
    EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    monkeypatch.chdir(tmp_path)
    assert import_cli.main(["hf", "imported", "model.dropout=0.1"]) == 0
    out = capsys.readouterr().out
    assert "\n  ptdp-train imported.yaml\n" in out and "--tokenizer hf" in out
    import yaml
    tree = yaml.safe_load((tmp_path / "imported.yaml").read_text())
    assert tree["checkpoint"] == {"dir": str(tmp_path / "imported")}
    assert tree["model"]["num_kv_heads"] == 2 and tree["model"]["dropout"] == 0.1
    monkeypatch.chdir(tmp_path / "hf")                  # the file works from anywhere
    ov = {k: v for k, v in H.tiny(tmp_path, data_cache).items()
          if not k.startswith(("model.", "checkpoint."))}
    log = H.Log()
    res = train(tmp_path / "imported.yaml", mesh_shape=(1, 1, 1),
                overrides={**ov, "train.steps": 1}, log=log, return_params=False)
    assert res.start_step == 0 and len(res.losses) == 1
    assert f"resumed from {tmp_path / 'imported'} at step 0" in log.text
    assert import_cli.main([str(tmp_path / "hf"), str(tmp_path / "other")]) == 0   # a new name: fine
    (tmp_path / "again.yaml").write_text("mine")
    assert import_cli.main([str(tmp_path / "hf"), str(tmp_path / "again")]) == 2
    assert "again.yaml exists" in capsys.readouterr().err
    assert not (tmp_path / "again").exists() and (tmp_path / "again.yaml").read_text() == "mine"


# ----------------------------------------------------------------------------- refusals

def test_import_refuses_what_it_cannot_honour(tmp_path, capsys):
    """Item 4: ptdp-import-hf model.num_layers=8 on a 2-layer source, or train.lr=...
    (which ptdp-train never reads back from a checkpoint): refused, naming the key,
    nothing written; a shorter model.seq_len cuts GPT's position table."""
    from ptdp_jax.interop import hf_import as HI
    _checkpoint(tmp_path, "gpt", mesh=(1, 1, 1))
    EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    for bad, words in [("model.num_layers=8", "model.num_layers=8: the source"),
                       ("train.lr=1e-4", "train.lr: ptdp-import-hf writes the model only"),
                       ("model.seq_len=32", "can only be shortened"),
                       ("model.norm_eps=0.1", "model.norm_eps=0.1")]:
        assert import_cli.main([str(tmp_path / "hf"), str(tmp_path / "no"), bad]) == 2, bad
        assert words in capsys.readouterr().err, bad
        assert not (tmp_path / "no").exists()
    assert import_cli.main([str(tmp_path / "hf"), str(tmp_path / "short"), "model.seq_len=8"]) == 0
    cfg, params = CK.load_params(tmp_path / "short")
    assert cfg.model.seq_len == 8 and params["embed"]["wpe"].shape == (8, 32)


def test_export_writes_a_tokenizer_and_readable_files(tmp_path):
    """Item 10: the byte tokenizer goes along as a tokenizer.json whose ids are the bytes
    (and <|endoftext|> = 256); model.safetensors is readable like the other files."""
    import os
    import stat
    from tokenizers import Tokenizer
    _checkpoint(tmp_path, "gpt", mesh=(1, 1, 1))
    out = EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "The café ✓ 日本\n"
    assert tok.encode(text).ids == list(text.encode()) and tok.decode(list(text.encode())) == text
    assert tok.token_to_id("<|endoftext|>") == 256
    conf = json.loads((out / "tokenizer_config.json").read_text())
    assert conf["eos_token"] == "<|endoftext|>" and conf["model_max_length"] == 16
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask, name


@needs_hf
def test_exported_tokenizers_load_in_transformers(tmp_path):
    """AutoTokenizer of an export encodes as training did (the byte tokenizer here, a BPE
    dataset's below); --tokenizer of another vocabulary than the data's is refused."""
    from ptdp_jax.data import BPETokenizer
    _checkpoint(tmp_path, "gpt", mesh=(1, 1, 1))
    text = "Pipeline parallelism splits layers; ünïcödé"
    out = EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok(text)["input_ids"] == list(text.encode()) and tok.eos_token_id == 256
    assert tok.decode(list(text.encode())) == text
    bpe = BPETokenizer.train([text * 20, "more text to learn merges from " * 20], 280)
    bpe.save(tmp_path / "bpe.json")
    with pytest.raises(ValueError, match="has 280 ids but the model was trained with 'byte'"):
        EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf2",
                             tokenizer=str(tmp_path / "bpe.json"))


@needs_hf
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_export_of_a_bpe_model_carries_its_token_ids(tmp_path, arch):
    """A model of BPE data (its <|endoftext|> is id 0): config.json, generation_config.json
    and the tokenizer name id 0 as bos/eos/pad, so that `generate` on the export alone
    stops where training data ended a document (all-zero logits: greedy picks id 0)."""
    from ptdp_jax.data import BPETokenizer, prepare_dataset
    (tmp_path / "a.txt").write_text("Some text for a tokenizer to learn from. " * 200)
    prefix = prepare_dataset([str(tmp_path / "a.txt")], tmp_path / "bpe", tokenizer="bpe",
                             bpe_vocab_size=300)
    eos = json.loads((tmp_path / "bpe.json").read_text())["eos_id"]
    assert eos == 0
    _checkpoint(tmp_path, arch, mesh=(1, 1, 1), **{"data.path": str(prefix)})
    out = EX.export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    conf = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    for c in (conf, gen):
        assert (c["bos_token_id"], c["eos_token_id"]) == (eos, eos), c
    assert gen["pad_token_id"] == eos
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token_id == tok.bos_token_id == tok.pad_token_id == eos
    text = "Some text for a tokenizer; ünïcödé"
    assert tok(text)["input_ids"] == BPETokenizer.from_file(f"{prefix}.tokenizer.json").encode(text)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():                             # every logit 0: greedy picks id 0
        final = model.transformer.ln_f if arch == "gpt" else model.model.norm
        final.weight.zero_()
        if arch == "gpt":
            final.bias.zero_()
    ids = tok("Some text", return_tensors="pt")
    got = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert got[0, ids["input_ids"].shape[1]:].tolist() == [eos]
