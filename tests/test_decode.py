"""Generation with the key/value cache (models/decode.py) against the window re-run for
every token: the same greedy (and sampled) tokens for GPT and for LLaMA with grouped-query
attention, past model.seq_len too; the cached logits equal the full forward's."""
import jax
import numpy as np
import pytest

from ptdp_jax.config.load import load_config
from ptdp_jax.run.generate import generate
from ptdp_jax.models import decode as D
from ptdp_jax.models import model as M
from ptdp_jax.parallel.sharding import Sharder

# a large init_std spreads the logits of the random model, so that greedy picks are no ties
TINY = {"model.num_layers": 2, "model.hidden_size": 32, "model.num_heads": 4,
        "model.seq_len": 16, "model.init_std": 0.3}
ARCHS = {"gpt": {"model.arch": "gpt"},
         "llama": {"model.arch": "llama", "model.num_kv_heads": 2, "model.ffn_hidden_size": 64}}


def model(arch):
    cfg = load_config(overrides={**TINY, **ARCHS[arch]}).model
    return cfg, M.init_params(cfg, seed=3)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cached_logits_are_the_full_forwards(arch):
    """A prefill of 5 tokens, then one at a time: each position's logits are those of the
    whole sequence run at once."""
    cfg, params = model(arch)
    sh = Sharder()
    tokens = jax.random.randint(jax.random.key(1), (1, cfg.seq_len), 0, cfg.vocab_size)
    full = jax.jit(lambda p, t: M.logits(cfg, sh, p["embed"], p["head"], M.run_layers(
        cfg, sh, p["layers"], M.embed(cfg, sh, p["embed"], t))))(params, tokens)[0]
    forward = jax.jit(D.forward, static_argnums=(0, 1))
    cache = D.init_cache(cfg, params)
    assert cache["k"].shape == (2, 1, 16, cfg.kv_heads, 8)          # llama: 2 kv heads of 4
    got, cache = forward(cfg, sh, params, tokens[:, :5], 0, cache)
    rows = [got[0]]
    for pos in range(5, cfg.seq_len):
        got, cache = forward(cfg, sh, params, tokens[:, pos:pos + 1], pos, cache)
        rows.append(got[0])
    np.testing.assert_allclose(np.concatenate(rows), np.asarray(full), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_tokens_with_and_without_the_cache(arch):
    """30 tokens after a 5-token prompt with seq_len 16: the cache fills, then the window
    slides; the tokens are those of the window re-run for every token."""
    cfg, params = model(arch)
    prompt = [84, 104, 101, 32, 99]
    ref = generate(cfg, params, prompt, 30, kv_cache=False)
    assert generate(cfg, params, prompt, 30) == ref
    assert len(set(ref)) > 3                                   # not one token repeated
    sampled = dict(temperature=0.8, top_k=20, seed=4)
    assert generate(cfg, params, prompt, 20, **sampled) == \
        generate(cfg, params, prompt, 20, kv_cache=False, **sampled)
    assert generate(cfg, params, [], 3) == generate(cfg, params, [], 3, kv_cache=False)
