"""ptdp-export: a checkpoint as a Hugging Face directory whose logits match ours."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers_ckpt as H
from ptdp_jax import checkpoint as CK
from ptdp_jax import export as EX
from ptdp_jax.models import model as M
from ptdp_jax.pipeline.balance import chunk_layers
from ptdp_jax.sharding import Sharder, make_mesh
from ptdp_jax.step import compile_all, make_optimizer
from ptdp_jax.train import resolve_config

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


def _checkpoint(tmp_path, arch, mesh=(1, 2, 2)):
    """A checkpoint (written from a pipelined, tensor-parallel layout) of random params."""
    ov = H.tiny(tmp_path, tmp_path / "data", **{
        "model.arch": arch, "model.num_layers": 2, "model.hidden_size": 32,
        "model.num_heads": 4, "model.vocab_size": 300, "model.seq_len": 16,
        "model.rope_theta": 500.0, "model.norm_eps": 1e-6})
    cfg = resolve_config(None, mesh, ov)
    tx, _ = make_optimizer(cfg)
    compiled = compile_all(cfg, make_mesh(mesh), tx)
    params = _random_params(cfg)
    state = compiled.init()
    stage = dict(params, layers=M.to_stage_layout(params["layers"], chunk_layers(cfg),
                                                  cfg.parallel.pipe))
    state["params"] = jax.device_put(stage, compiled.shardings["params"])
    state["step"] = jnp.int32(3)
    with CK.CheckpointManager(cfg, compiled.shardings) as m:
        m.save(3, state)
    return cfg, params


@needs_hf
@pytest.mark.parametrize("arch,hf_class", [("gpt", "GPT2LMHeadModel"),
                                           ("llama", "LlamaForCausalLM")])
def test_export_matches_transformers(tmp_path, arch, hf_class, capsys):
    cfg, params = _checkpoint(tmp_path, arch)
    out = tmp_path / "hf"
    assert EX.main([str(tmp_path / "ckpt"), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == [hf_class] and conf["vocab_size"] == 300

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
    (tmp_path / "x").mkdir()
    assert EX.main([str(tmp_path / "x"), str(tmp_path / "out")]) == 2
    assert "no complete ptdp_jax checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_import_round_trip(tmp_path, arch, capsys):
    """export -> ptdp-import-hf -> a step-0 checkpoint with the same parameters, which
    restores on another layout."""
    from ptdp_jax import hf_import as HI
    cfg, params = _checkpoint(tmp_path, arch, mesh=(1, 1, 1))
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

    dest = tmp_path / "imported"
    assert HI.main([str(tmp_path / "hf"), str(dest), "train.lr=1e-4"]) == 0
    assert "model.hidden_size=32" in capsys.readouterr().out
    assert HI.main([str(tmp_path / "hf"), str(dest)]) == 2            # not into a used dir
    c2, state, meta = CK.load_checkpoint(dest)
    assert meta["step"] == 0 and c2.train.lr == 1e-4 and c2.model == resolve_config(
        None, None, model).model
    ov = dict(H.tiny(tmp_path, tmp_path / "data", **model), **{"checkpoint.dir": str(dest)})
    run_cfg = resolve_config(None, (1, 1, 2), ov)
    m = CK.CheckpointManager(run_cfg, compile_all(run_cfg, make_mesh((1, 1, 2)),
                                                  make_optimizer(run_cfg)[0]).shardings)
    restored, step = m.restore_latest()
    m.close()
    assert step == 0
    got = CK.to_canonical_state(run_cfg, m.tx, jax.device_get(restored))["params"]
    for a, b in zip(jax.tree.leaves(jax.device_get(got)), jax.tree.leaves(imported)):
        np.testing.assert_array_equal(a, b)
