"""LLaMA-3.1's rope scaling (model.rope_scaling_factor, rope_low_freq_factor,
rope_high_freq_factor, rope_original_seq_len): the frequencies of transformers' llama3 rope
type; factor 1 is exactly the unscaled rotary; decoding with the cache follows the scaling;
an export transformers runs to the same logits; a LLaMA-3.1-style config.json through import
and export; the validation; checkpoint.load_weights into a longer context."""
import json
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers_ckpt as H
from test_export import _checkpoint, _our_logits
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.checkpoint.format import CheckpointError
from ptdp_jax.checkpoint.hf import llama_model
from ptdp_jax.checkpoint.weights import check_load_weights
from ptdp_jax.cli import export as export_cli, import_hf as import_cli
from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.config.schema import ModelConfig
from ptdp_jax.config.validation import validate
from ptdp_jax.interop.export import byte_tokenizer_json
from ptdp_jax.models import decode as D
from ptdp_jax.models import model as M
from ptdp_jax.models.layers import rope_frequencies, rotary
from ptdp_jax.parallel.sharding import Sharder
from ptdp_jax.run.loop import resolve_config

try:
    import torch
    import transformers
except ImportError as e:          # CI installs them: pip install torch==2.13.0 transformers
    torch = transformers = None
    _why = f"needs torch and transformers ({e}); pip install torch==2.13.0 transformers"

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
needs_hf = pytest.mark.skipif(transformers is None, reason=_why if transformers is None else "")

# LLaMA-3.1 8B's heads and rope settings
LLAMA31 = dict(arch="llama", hidden_size=4096, num_heads=32, rope_theta=500000.0,
               rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
               rope_original_seq_len=8192)
LLAMA31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
# head_dim 8, rope_theta 500: wavelengths 6.3, 30, 140, 664; an original context of 32 keeps
# the first (below 32 / 4), interpolates the second and divides the last two (above 32 / 1)
SCALED = {"model.seq_len": 64, "model.rope_scaling_factor": 4.0,
          "model.rope_original_seq_len": 32, "model.num_kv_heads": 2}


def llama3_numpy(theta, d, factor, low, high, original):
    """The llama3 rope type's frequencies, as transformers writes them, in float64."""
    freqs = 1.0 / theta ** (np.arange(0, d, 2) / d)
    wavelen = 2 * np.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    scaled = np.where(wavelen > original / low, freqs / factor, freqs)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def test_frequencies_are_llama31s():
    """LLaMA-3.1's numbers (head_dim 128): float32 frequencies of the llama3 formula, with
    each of its three bands (kept, divided by 8, between) present."""
    ours = rope_frequencies(ModelConfig(**LLAMA31))
    assert ours.dtype == jnp.float32 and ours.shape == (64,)
    want = llama3_numpy(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(np.asarray(ours), want, rtol=1e-6)
    ratio = (1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)) / want
    kept, divided = np.isclose(ratio, 1.0), np.isclose(ratio, 8.0)
    assert kept.sum() and divided.sum() and (~kept & ~divided).sum(), ratio


@needs_hf
def test_frequencies_are_transformers_llama3():
    """The same frequencies as transformers' _compute_llama3_parameters (within an ulp)."""
    from transformers.modeling_rope_utils import _compute_llama3_parameters
    conf = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32,
                                    max_position_embeddings=131072, rope_theta=500000.0,
                                    rope_scaling=dict(LLAMA31_SCALING))
    theirs = _compute_llama3_parameters(conf, "cpu")[0].numpy()
    ours = np.asarray(rope_frequencies(ModelConfig(**LLAMA31)))
    np.testing.assert_allclose(ours, theirs, rtol=2e-7)


def rotary_unscaled(x_bsnd, theta: float, offset=0):
    """The rotary embedding before rope scaling, as it was written (its frequencies inside)."""
    b, s, n, d = x_bsnd.shape
    freqs_d2 = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    positions = (offset + jnp.arange(s)).astype(jnp.float32)
    angles_sd2 = positions[:, None] * freqs_d2[None, :]
    cos_1s11h = jnp.cos(angles_sd2)[None, :, None, None, :]
    sin_1s12h = jnp.sin(angles_sd2)[None, :, None, None, :] * jnp.array([-1.0, 1.0])[:, None]
    x_bsn2h = x_bsnd.astype(jnp.float32).reshape(b, s, n, 2, d // 2)
    out = x_bsn2h * cos_1s11h + x_bsn2h[..., ::-1, :] * sin_1s12h
    return out.reshape(b, s, n, d).astype(x_bsnd.dtype)


@pytest.mark.parametrize("others", [{}, {"rope_low_freq_factor": 2.0, "rope_high_freq_factor": 8.0,
                                         "rope_original_seq_len": 4}], ids=["defaults", "others"])
def test_factor_1_is_the_unscaled_rotary(others):
    """rope_scaling_factor=1, whatever the other rope scaling keys: the frequencies and the
    rotary (eager and jitted) bit for bit those of the code before rope scaling."""
    cfg = ModelConfig(arch="llama", hidden_size=32, num_heads=4, rope_theta=500.0, **others)
    np.testing.assert_array_equal(
        rope_frequencies(cfg), 1.0 / (500.0 ** (jnp.arange(0, 8, 2, dtype=jnp.float32) / 8)))
    x = jax.random.normal(jax.random.key(0), (2, 16, 4, 8), jnp.float32)
    for run in (lambda f: f, jax.jit):
        np.testing.assert_array_equal(run(lambda a: rotary(a, rope_frequencies(cfg), 3))(x),
                                      run(lambda a: rotary_unscaled(a, 500.0, 3))(x))


def test_factor_1_model_is_unchanged_and_decoding_follows_the_scaling():
    """A tiny LLaMA: rope_scaling_factor=1 with other rope scaling keys gives bit for bit the
    logits of the defaults; with scaling the logits change, and decoding with the cache gives
    those of the full forward."""
    tiny = {"model.arch": "llama", "model.num_layers": 2, "model.hidden_size": 32,
            "model.num_heads": 4, "model.init_std": 0.3, "model.rope_theta": 500.0}
    logits = {}
    for name, extra in [("default", {}), ("factor1", {"model.rope_original_seq_len": 8,
                                                      "model.rope_high_freq_factor": 2.0}),
                        ("scaled", SCALED)]:
        cfg = load_config(overrides={**tiny, **extra}).model
        params = M.init_params(cfg, seed=3)
        tokens = jax.random.randint(jax.random.key(1), (1, 32), 0, cfg.vocab_size)
        sh = Sharder()
        logits[name] = np.asarray(jax.jit(lambda p, t: M.logits(cfg, sh, p["embed"], p["head"],
                                  M.run_layers(cfg, sh, p["layers"],
                                               M.embed(cfg, sh, p["embed"], t))))(params, tokens))
    np.testing.assert_array_equal(logits["factor1"], logits["default"])
    forward = jax.jit(D.forward, static_argnums=(0, 1))
    got, cache = forward(cfg, sh, params, tokens[:, :20], 0, D.init_cache(cfg, params))
    rows = [got[0]]
    for pos in range(20, 32):
        got, cache = forward(cfg, sh, params, tokens[:, pos:pos + 1], pos, cache)
        rows.append(got[0])
    np.testing.assert_allclose(np.concatenate(rows), logits["scaled"][0], rtol=1e-5, atol=1e-5)
    unscaled = load_config(overrides={**tiny, **SCALED, "model.rope_scaling_factor": 1.0}).model
    base = np.asarray(M.logits(unscaled, sh, params["embed"], params["head"], M.run_layers(
        unscaled, sh, params["layers"], M.embed(unscaled, sh, params["embed"], tokens))))
    assert np.abs(base - logits["scaled"]).max() > 1e-2


@needs_hf
def test_export_with_rope_scaling_matches_transformers(tmp_path):
    """A tiny LLaMA with rope scaling, exported with ptdp-export: config.json has rope_scaling
    of rope_type llama3, and transformers' LlamaForCausalLM gives our frequencies and logits
    (those of the model without scaling are far off)."""
    cfg, params = _checkpoint(tmp_path, "llama", mesh=(1, 1, 1), **SCALED)
    out = tmp_path / "hf"
    assert export_cli.main([str(tmp_path / "ckpt"), str(out)]) == 0
    conf = json.loads((out / "config.json").read_text())
    scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    assert conf["rope_scaling"] == scaling and conf["rope_theta"] == 500.0
    assert conf["rope_parameters"] == {**scaling, "rope_theta": 500.0}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model.eval()
    np.testing.assert_allclose(model.model.rotary_emb.inv_freq.numpy(),
                               np.asarray(rope_frequencies(cfg.model)), rtol=2e-7)
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, (2, cfg.model.seq_len))
    with torch.no_grad():
        theirs = model(torch.tensor(tokens)).logits.numpy()
    V = cfg.model.vocab_size
    ours = _our_logits(cfg.model, params, jnp.asarray(tokens, jnp.int32))[..., :V]
    rel = lambda a: np.abs(theirs - a).max() / np.abs(a).max()
    assert rel(ours) < 1e-4, rel(ours)
    unscaled = replace(cfg.model, rope_scaling_factor=1.0)
    assert rel(_our_logits(unscaled, params, jnp.asarray(tokens, jnp.int32))[..., :V]) > 1e-3


def _llama31_folder(path):
    """A tiny LLaMA of random weights whose config.json is written as LLaMA-3.1's is
    (transformers 4.x: rope_theta beside rope_scaling), with the byte tokenizer."""
    conf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300,
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500.0,
            "rope_scaling": {**LLAMA31_SCALING, "factor": 4.0,
                             "original_max_position_embeddings": 32},
            "attention_bias": False, "mlp_bias": False, "initializer_range": 0.3,
            "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 256}
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**json.loads(json.dumps(conf)))) \
        .save_pretrained(str(path))
    (path / "config.json").write_text(json.dumps(conf, indent=2))
    (path / "tokenizer.json").write_text(byte_tokenizer_json())
    return conf


@needs_hf
def test_llama31_config_round_trips(tmp_path):
    """A LLaMA-3.1-style folder: ptdp-import-hf reads its rope_scaling into the model.rope_*
    keys (our logits of its weights are transformers'), and ptdp-export of the imported
    checkpoint writes the same rope_theta, rope_scaling and max_position_embeddings."""
    src = tmp_path / "llama31"
    conf = _llama31_folder(src)
    assert import_cli.main([str(src), str(tmp_path / "imported")]) == 0
    cfg, params = CK.load_params(tmp_path / "imported")
    m = cfg.model
    assert (m.rope_theta, m.rope_scaling_factor, m.rope_low_freq_factor, m.rope_high_freq_factor,
            m.rope_original_seq_len, m.seq_len) == (500.0, 4.0, 1.0, 4.0, 32, 64)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    tokens = np.random.default_rng(0).integers(0, 300, (2, 64))
    with torch.no_grad():
        theirs = model.eval()(torch.tensor(tokens)).logits.numpy()
    ours = _our_logits(m, params, jnp.asarray(tokens, jnp.int32))[..., :300]
    assert np.abs(theirs - ours).max() / np.abs(ours).max() < 1e-4
    assert export_cli.main([str(tmp_path / "imported"), str(tmp_path / "out")]) == 0
    back = json.loads((tmp_path / "out" / "config.json").read_text())
    for key in ("rope_theta", "rope_scaling", "max_position_embeddings"):
        assert back[key] == conf[key], (key, back[key], conf[key])


LLAMA = {"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


@pytest.mark.parametrize("rope,words", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn' is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type='linear' is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_type='dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}},
     "rope_type='llama3' without low_freq_factor"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported"),
])
def test_other_rope_types_are_refused(rope, words):
    """A config.json of another rope type (or a partial rotary embedding), or a llama3 one
    missing a value: one ValueError naming it."""
    with pytest.raises(ValueError, match=words):
        llama_model({**LLAMA, **rope})


def test_llama3_rope_parameters_of_transformers_5():
    """transformers 5.x writes rope_parameters (rope_theta inside), without
    original_max_position_embeddings where it is max_position_embeddings."""
    model = llama_model({**LLAMA, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8, "low_freq_factor": 1,
        "high_freq_factor": 4}})
    cfg = load_config(None, model).model
    assert (cfg.rope_theta, cfg.rope_scaling_factor, cfg.rope_original_seq_len) == (5e5, 8.0, 64)
    assert llama_model({**LLAMA, "rope_theta": 5e5})["model.rope_theta"] == 5e5
    assert "model.rope_scaling_factor" not in llama_model(LLAMA)


@pytest.mark.parametrize("overrides,message", [
    ({"model.rope_scaling_factor": 0.5},
     "model.rope_scaling_factor must be >= 1 (1: no scaling), got 0.5"),
    ({"model.rope_low_freq_factor": 0.0}, "model.rope_low_freq_factor must be positive, got 0.0"),
    ({"model.rope_high_freq_factor": 1.0}, "model.rope_high_freq_factor=1.0 must be greater "
                                           "than model.rope_low_freq_factor=1.0"),
    ({"model.rope_original_seq_len": 0}, "model.rope_original_seq_len must be positive, got 0"),
    ({"model.arch": "gpt", "model.rope_scaling_factor": 8.0},
     "model.rope_scaling_factor=8.0: rope scaling is for model.arch=llama"),
    ({"model.arch": "gpt", "model.rope_original_seq_len": 4096},
     "model.rope_original_seq_len=4096: rope scaling is for model.arch=llama"),
])
def test_validation_names_the_key_and_numbers(overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides={"model.arch": "llama", **overrides}), 1)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_load_weights_into_a_longer_context(tmp_path):
    """checkpoint.load_weights of a LLaMA checkpoint (seq_len 16): a run of seq_len 64 may
    change the rope keys (the source then says what changed); one of the same seq_len may not,
    the error naming the key, both numbers and the way out."""
    _checkpoint(tmp_path, "llama", mesh=(1, 1, 1))
    ov = H.tiny(tmp_path, tmp_path / "data", **{
        "model.arch": "llama", "model.num_layers": 2, "model.hidden_size": 32,
        "model.num_heads": 4, "model.vocab_size": 300, "model.rope_theta": 500.0,
        "model.norm_eps": 1e-6, "checkpoint.dir": str(tmp_path / "longer"),
        "checkpoint.load_weights": str(tmp_path / "ckpt")})
    longer = {"model.seq_len": 64, "model.rope_theta": 5000.0, "model.rope_scaling_factor": 4.0,
              "model.rope_original_seq_len": 16}
    source = check_load_weights(resolve_config(None, (1, 1, 1), {**ov, **longer}))
    assert source.describe().endswith(
        "(context extended: model.seq_len 16 -> 64, model.rope_theta 500.0 -> 5000.0, "
        "model.rope_scaling_factor 1.0 -> 4.0, model.rope_original_seq_len 8192 -> 16)")
    with pytest.raises(CheckpointError) as e:
        check_load_weights(resolve_config(None, (1, 1, 1), {**ov, "model.rope_theta": 5000.0}))
    msg = str(e.value)
    assert "model.rope_theta: checkpoint 500.0, config 5000.0" in msg and "\n" not in msg
    assert "a longer model.seq_len than the checkpoint's may change the rope keys" in msg
