"""LLaMA: pre-normalization with RMSNorm, SwiGLU MLP, rotary position
embeddings, no biases, untied output layer; grouped-query attention (LLaMA-2/3) with
model.num_kv_heads < num_heads. Pure functions over a dict of parameters."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.models.layers import (ACT, ACT_FULL, FFN, FFN_ACT, HEADS, attention_impl,
                                    causal_attention, column_dense, dropout, fold_rows,
                                    gather_seq, row_dense, rms_norm, rope_frequencies,
                                    rotary, starts_of, weight)

# the layer's GEMMs through layers.dense: weight name -> einsum spec
GEMM_SPECS = {"wq": "bsh,hnd->bsnd", "wk": "bsh,hnd->bsnd", "wv": "bsh,hnd->bsnd",
              "wo": "bsnd,ndh->bsh", "w_gate": "bsh,hf->bsf", "w_up": "bsh,hf->bsf",
              "w_down": "bsf,fh->bsh"}
DENSE_WEIGHTS = tuple(GEMM_SPECS)
HEAD_EMBED = ()                # embedding weights the head reads too (untied: none)


def param_specs(cfg):
    h, n, d, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.ffn
    kv = cfg.kv_heads             # key/value heads, split over 'tensor' like the query heads
    return {
        "embed": {"tok": ((cfg.padded_vocab_size, h), ("vocab", "embed"), "normal")},
        "layer": {
            "attn_norm": ((h,), ("embed",), "ones"),
            "wq": ((h, n, d), ("embed", "heads", "head_dim"), "normal"),
            "wk": ((h, kv, d), ("embed", "heads", "head_dim"), "normal"),
            "wv": ((h, kv, d), ("embed", "heads", "head_dim"), "normal"),
            "wo": ((n, d, h), ("heads", "head_dim", "embed"), "scaled"),
            "mlp_norm": ((h,), ("embed",), "ones"),
            "w_gate": ((h, f), ("embed", "mlp"), "normal"),
            "w_up": ((h, f), ("embed", "mlp"), "normal"),
            "w_down": ((f, h), ("mlp", "embed"), "scaled"),
        },
        "head": {
            "norm": ((h,), ("embed",), "ones"),
            "out": ((h, cfg.padded_vocab_size), ("embed", "vocab"), "normal"),
        },
    }


def embed(p, tokens_bs, cfg, sh, key_rows=None):
    x_bsh = sh.constrain(sh.constrain(p["tok"][tokens_bs], ACT_FULL), ACT)   # as gpt.embed
    x_bsh = dropout(x_bsh, cfg.dropout, fold_rows(key_rows, 1 << 20))
    return sh.constrain(x_bsh, ACT)


def layer(p, x_bsh, cfg, sh, key_rows=None):
    impl = attention_impl(getattr(sh, "attention", "auto"), x_bsh.dtype)
    y = rms_norm(x_bsh, p["attn_norm"], cfg.norm_eps)
    gemms = lambda names: [(GEMM_SPECS[w], weight(p, w), None) for w in names]
    q, k, v = column_dense(sh, y, gemms(("wq", "wk", "wv")), HEADS)
    pos = None if sh.context == 1 else sh.positions(q.shape[0], q.shape[1])
    freqs_d2 = rope_frequencies(cfg)
    q, k = (rotary(a, freqs_d2, positions_bs=pos) for a in (q, k))
    # grouped-query attention in the kernels (k, v with their own heads: query head j reads
    # key/value head j // (n / kv), as Hugging Face's repeat_kv): no repeated copies, and
    # context parallelism gathers the key/value heads only
    a_bsnd = sh.constrain(causal_attention(q, k, v, impl, sh, starts_of(key_rows)), HEADS)
    attn_bsh = row_dense(sh, a_bsnd, GEMM_SPECS["wo"], weight(p, "wo"))
    x_bsh = x_bsh + dropout(attn_bsh, cfg.dropout, fold_rows(key_rows, 0))
    y = rms_norm(x_bsh, p["mlp_norm"], cfg.norm_eps)
    g_bsf, u_bsf = column_dense(sh, y, gemms(("w_gate", "w_up")), FFN)
    act_bsf = checkpoint_name(jax.nn.silu(g_bsf) * u_bsf, FFN_ACT)
    mlp_bsh = row_dense(sh, act_bsf, GEMM_SPECS["w_down"], weight(p, "w_down"))
    x_bsh = x_bsh + dropout(mlp_bsh, cfg.dropout, fold_rows(key_rows, 1))
    return sh.constrain(x_bsh, ACT)


def logits(embed_p, head_p, x_bsh, cfg, sh):
    y = gather_seq(sh, rms_norm(x_bsh, head_p["norm"], cfg.norm_eps))
    return sh.constrain(jnp.einsum("bsh,hv->bsv", y, head_p["out"]), ("batch", "seq", "vocab"))
