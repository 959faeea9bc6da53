"""Text generation from canonical parameters: the closing sample of a run and
`ptdp-generate`.

    ptdp-generate CKPT --prompt TEXT [--max-new-tokens N] [--temperature T --top-k K]

One device, no mesh. With the key/value cache (the default, models/decode.py) the prompt's
window is run once and each new token then runs alone against the cached keys and values.
The context is at most model.seq_len tokens: past it each new token runs the last seq_len
again, as without the cache (kv_cache=False: every token re-runs the window), whose tokens
the cached path gives too. Plenty for a sample, not a serving engine.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.models import decode as D
from ptdp_jax.models import model as M
from ptdp_jax.parallel.sharding import Sharder


def generate(model_cfg, params, prompt_ids: list[int], num_tokens: int, *,
             temperature: float = 0.0, top_k: int = 0, seed: int = 0,
             kv_cache: bool = True) -> list[int]:
    """`num_tokens` new token ids after `prompt_ids`: greedy with temperature 0, else
    sampled from softmax(logits / temperature), restricted to the top_k likeliest
    (0: all); the draws are a function of `seed` and the position. kv_cache=False: the
    window re-run for every token (the reference the cached path is tested against)."""
    s = model_cfg.seq_len
    params = jax.tree.map(jnp.asarray, params)
    k = int(top_k) if top_k and top_k < model_cfg.vocab_size else 0
    window_token, prefill, extend = _decoders(model_cfg, float(temperature), k)
    ids = list(prompt_ids) or [0]
    out = []
    root = jax.random.key(seed)
    cache, pos = None, s                 # pos: the tokens in the cache
    for i in range(num_tokens):
        key = jax.random.fold_in(root, i)
        if kv_cache and pos < s:         # the last token joins the cache at position pos
            tok, cache = extend(params, cache, jnp.int32(ids[-1]), jnp.int32(pos), key)
            pos += 1
        else:                            # the window of the last s tokens from position 0
            ctx = ids[-s:]
            window = np.zeros((s,), np.int32)
            window[: len(ctx)] = ctx
            if kv_cache:
                tok, cache = prefill(params, jnp.asarray(window), len(ctx) - 1, key)
                pos = len(ctx)
            else:
                tok = window_token(params, jnp.asarray(window), len(ctx) - 1, key)
        tok = int(tok)
        ids.append(tok)
        out.append(tok)
    return out


@functools.lru_cache(maxsize=8)
def _decoders(model_cfg, temperature: float, k: int):
    """The jitted (window_token, prefill, extend) of a model and a way of picking tokens,
    kept so that generating again compiles nothing."""
    sh = Sharder()

    def pick(logits_v, key):
        logits_v = logits_v.astype(jnp.float32)
        logits_v = jnp.where(jnp.arange(logits_v.shape[0]) < model_cfg.vocab_size, logits_v,
                             -jnp.inf)
        if temperature == 0:
            return jnp.argmax(logits_v)
        logits_v = logits_v / temperature
        if k:
            kth = jax.lax.top_k(logits_v, k)[0][-1]
            logits_v = jnp.where(logits_v >= kth, logits_v, -jnp.inf)
        return jax.random.categorical(key, logits_v)

    @jax.jit
    def window_token(params, window_s, last, key):
        x = M.embed(model_cfg, sh, params["embed"], window_s[None])
        x = M.run_layers(model_cfg, sh, params["layers"], x)
        return pick(M.logits(model_cfg, sh, params["embed"], params["head"], x)[0, last], key)

    @jax.jit
    def prefill(params, window_s, last, key):
        cache = D.init_cache(model_cfg, params)
        logits, cache = D.forward(model_cfg, sh, params, window_s[None], 0, cache)
        return pick(logits[0, last], key), cache

    @jax.jit                             # no donation: XLA:CPU does not use donated buffers
    def extend(params, cache, token, pos, key):
        logits, cache = D.forward(model_cfg, sh, params, token[None, None], pos, cache)
        return pick(logits[0, 0], key), cache

    return window_token, prefill, extend


def greedy_generate(model_cfg, params, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding (generate with temperature 0)."""
    return generate(model_cfg, params, prompt_ids, num_tokens)
