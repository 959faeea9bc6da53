"""Decoding with a key/value cache (GPT and LLaMA, grouped-query attention included): the
model on `t` new tokens at positions pos .. pos + t - 1, their keys and values written into a
cache of model.seq_len positions, the queries attending to the cached positions up to their own.

    cache = init_cache(cfg, params)                            # zeros, (L, b, seq_len, kv, d)
    logits, cache = forward(cfg, sh, params, window, 0, cache)          # prefill
    logits, cache = forward(cfg, sh, params, next_token, pos, cache)    # one token at a time

The layers are those of models/gpt.py and models/llama.py, built from the same pieces
(layers.py), with only the attention reading the cache and the positions offset by `pos`
(learned positions for GPT, rotary for LLaMA); tests/test_decode.py holds the two paths to
the same greedy tokens. LLaMA caches its kv key/value heads, not the num_heads they serve.
Logical axis names only: `sh` is a Sharder (single device: `Sharder()`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ptdp_jax.models.layers import (ACT, FFN, HEADS, column_dense, layer_norm, rms_norm,
                                    rope_frequencies, rotary, row_dense)
from ptdp_jax.models.model import logits as model_logits

CACHE = ("layers", "batch", "seq", "heads", "head_dim")    # (L, b, S, kv, d) keys or values


def init_cache(cfg, params, batch: int = 1, length: int | None = None):
    """A zero cache {'k', 'v'}: (L, batch, length (model.seq_len), kv heads, head_dim) in the
    parameters' dtype."""
    dtype = jax.tree.leaves(params["embed"])[0].dtype
    shape = (cfg.num_layers, batch, length or cfg.seq_len, cfg.kv_heads, cfg.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def cached_attention(q_btnd, k_btkd, v_btkd, k_bskd, v_bskd, pos):
    """Causal attention of t queries at positions pos .. pos + t - 1: their keys and values
    written into one layer's cache (b, S, kv, d) at pos first (pos + t <= S), then each query
    attends to the cached positions up to its own (kv < n: query head j reads key/value head
    j // (n / kv), as Hugging Face's repeat_kv). Returns (output (b, t, n, d), the cache's k, v)."""
    k_bskd = jax.lax.dynamic_update_slice(k_bskd, k_btkd.astype(k_bskd.dtype), (0, pos, 0, 0))
    v_bskd = jax.lax.dynamic_update_slice(v_bskd, v_btkd.astype(v_bskd.dtype), (0, pos, 0, 0))
    t, s = q_btnd.shape[1], k_bskd.shape[1]
    mask_ts = jnp.arange(s)[None, :] <= (pos + jnp.arange(t))[:, None]
    out = jax.nn.dot_product_attention(q_btnd, k_bskd, v_bskd, mask=mask_ts[None, None],
                                       implementation="xla")
    return out, k_bskd, v_bskd


def _gpt_embed(p, tokens_bt, pos):
    t = tokens_bt.shape[1]
    return p["wte"][tokens_bt] + jax.lax.dynamic_slice_in_dim(p["wpe"], pos, t)[None]


def _gpt_layer(p, x_bth, cfg, sh, pos, k_c, v_c):
    """gpt.layer without dropout, attention through the cache."""
    y = layer_norm(x_bth, p["ln1_scale"], p["ln1_bias"], cfg.norm_eps)
    q, k, v = column_dense(sh, y, [("bsh,hnd->bsnd", p[f"{c}_w"], p[f"{c}_b"]) for c in "qkv"],
                           HEADS)
    a_btnd, k_c, v_c = cached_attention(q, k, v, k_c, v_c, pos)
    x_bth = x_bth + row_dense(sh, sh.constrain(a_btnd, HEADS), "bsnd,ndh->bsh", p["out_w"],
                              p["out_b"])
    y = layer_norm(x_bth, p["ln2_scale"], p["ln2_bias"], cfg.norm_eps)
    u_btf, = column_dense(sh, y, [("bsh,hf->bsf", p["fc1_w"], p["fc1_b"])], FFN)
    x_bth = x_bth + row_dense(sh, jax.nn.gelu(u_btf, approximate=True), "bsf,fh->bsh",
                              p["fc2_w"], p["fc2_b"])
    return sh.constrain(x_bth, ACT), k_c, v_c


def _llama_embed(p, tokens_bt, pos):
    return p["tok"][tokens_bt]


def _llama_layer(p, x_bth, cfg, sh, pos, k_c, v_c):
    """llama.layer without dropout, attention through the cache, rotary from position pos."""
    y = rms_norm(x_bth, p["attn_norm"], cfg.norm_eps)
    q, k, v = column_dense(sh, y, [("bsh,hnd->bsnd", p[w], None) for w in ("wq", "wk", "wv")],
                           HEADS)
    freqs_d2 = rope_frequencies(cfg)
    q, k = (rotary(a, freqs_d2, offset=pos) for a in (q, k))
    a_btnd, k_c, v_c = cached_attention(q, k, v, k_c, v_c, pos)
    x_bth = x_bth + row_dense(sh, sh.constrain(a_btnd, HEADS), "bsnd,ndh->bsh", p["wo"])
    y = rms_norm(x_bth, p["mlp_norm"], cfg.norm_eps)
    g_btf, u_btf = column_dense(sh, y, [("bsh,hf->bsf", p[w], None)
                                        for w in ("w_gate", "w_up")], FFN)
    x_bth = x_bth + row_dense(sh, jax.nn.silu(g_btf) * u_btf, "bsf,fh->bsh", p["w_down"])
    return sh.constrain(x_bth, ACT), k_c, v_c


ARCHS = {"gpt": (_gpt_embed, _gpt_layer), "llama": (_llama_embed, _llama_layer)}


def forward(cfg, sh, params, tokens_bt, pos, cache):
    """(logits (b, t, V), the cache with the t tokens' keys and values at pos .. pos + t - 1):
    the model on tokens at those positions, after the cache's positions before pos. A scan
    over the layers (the cache's leading axis with them)."""
    embed, layer = ARCHS[cfg.arch]
    x_bth = sh.constrain(embed(params["embed"], tokens_bt, pos), ACT)

    def one(x, per_layer):
        lp, k_c, v_c = per_layer
        x, k_c, v_c = layer(lp, x, cfg, sh, pos, k_c, v_c)
        return x, (k_c, v_c)

    x_bth, (k, v) = jax.lax.scan(one, x_bth, (params["layers"], cache["k"], cache["v"]))
    cache = {"k": sh.constrain(k, CACHE), "v": sh.constrain(v, CACHE)}
    return model_logits(cfg, sh, params["embed"], params["head"], x_bth), cache
