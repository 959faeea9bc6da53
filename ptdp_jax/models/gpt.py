"""GPT as in Megatron: learned positions, pre-LayerNorm, GeLU MLP of 4h, biases,
input and output embeddings tied. Pure functions over a dict of parameters."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.models.layers import (ACT, ACT_FULL, FFN, FFN_ACT, HEADS, attention_impl,
                                    causal_attention, column_dense, dropout, fold_rows,
                                    gather_seq, layer_norm, row_dense, starts_of, weight)

# the layer's GEMMs through layers.dense: weight name -> einsum spec
GEMM_SPECS = {"q_w": "bsh,hnd->bsnd", "k_w": "bsh,hnd->bsnd", "v_w": "bsh,hnd->bsnd",
              "out_w": "bsnd,ndh->bsh", "fc1_w": "bsh,hf->bsf", "fc2_w": "bsf,fh->bsh"}
DENSE_WEIGHTS = tuple(GEMM_SPECS)
HEAD_EMBED = ("wte",)          # embedding weights the head reads too (tied)


def param_specs(cfg):
    """name -> (shape, logical axes, init). Groups: embed (first stage), layer
    (one transformer layer; stacked on a leading axis), head (last stage)."""
    h, n, d, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.ffn
    return {
        "embed": {
            "wte": ((cfg.padded_vocab_size, h), ("vocab", "embed"), "normal"),
            "wpe": ((cfg.seq_len, h), ("seq", "embed"), "normal"),
        },
        "layer": {
            "ln1_scale": ((h,), ("embed",), "ones"),
            "ln1_bias": ((h,), ("embed",), "zeros"),
            # q, k, v as three GEMMs (not one fused (h, 3, n, d) weight): each writes its
            # (b, s, n, d) operand of the attention kernel whole, with no slicing or packing
            **{f"{c}_w": ((h, n, d), ("embed", "heads", "head_dim"), "normal") for c in "qkv"},
            **{f"{c}_b": ((n, d), ("heads", "head_dim"), "zeros") for c in "qkv"},
            "out_w": ((n, d, h), ("heads", "head_dim", "embed"), "scaled"),
            "out_b": ((h,), ("embed",), "zeros"),
            "ln2_scale": ((h,), ("embed",), "ones"),
            "ln2_bias": ((h,), ("embed",), "zeros"),
            "fc1_w": ((h, f), ("embed", "mlp"), "normal"),
            "fc1_b": ((f,), ("mlp",), "zeros"),
            "fc2_w": ((f, h), ("mlp", "embed"), "scaled"),
            "fc2_b": ((h,), ("embed",), "zeros"),
        },
        "head": {
            "lnf_scale": ((h,), ("embed",), "ones"),
            "lnf_bias": ((h,), ("embed",), "zeros"),
        },
    }


def embed(p, tokens_bs, cfg, sh, key_rows=None):
    # vocab-parallel lookup: partial sums over 'tensor' reduced (ACT_FULL), split by sequence
    # under sequence parallelism (ACT): an all-reduce, or a reduce-scatter
    x_bsh = sh.constrain(sh.constrain(p["wte"][tokens_bs], ACT_FULL), ACT)
    if sh.context == 1:
        x_bsh = x_bsh + p["wpe"][None, : tokens_bs.shape[1]]
    else:                            # a device's chunks: their positions in the sequence
        x_bsh = x_bsh + p["wpe"][sh.positions(*tokens_bs.shape)]
    x_bsh = dropout(x_bsh, cfg.dropout, fold_rows(key_rows, 1 << 20))
    return sh.constrain(x_bsh, ACT)


def layer(p, x_bsh, cfg, sh, key_rows=None):
    """One pre-LN transformer layer: x + Attn(LN(x)), then + MLP(LN(.))."""
    impl = attention_impl(getattr(sh, "attention", "auto"), x_bsh.dtype)
    y = layer_norm(x_bsh, p["ln1_scale"], p["ln1_bias"], cfg.norm_eps)
    qkv = [(GEMM_SPECS[f"{c}_w"], weight(p, f"{c}_w"), p[f"{c}_b"]) for c in "qkv"]
    q, k, v = column_dense(sh, y, qkv, HEADS)
    a_bsnd = sh.constrain(causal_attention(q, k, v, impl, sh, starts_of(key_rows)), HEADS)
    attn_bsh = row_dense(sh, a_bsnd, GEMM_SPECS["out_w"], weight(p, "out_w"), p["out_b"])
    x_bsh = x_bsh + dropout(attn_bsh, cfg.dropout, fold_rows(key_rows, 0))
    y = layer_norm(x_bsh, p["ln2_scale"], p["ln2_bias"], cfg.norm_eps)
    u_bsf, = column_dense(sh, y, [(GEMM_SPECS["fc1_w"], weight(p, "fc1_w"), p["fc1_b"])], FFN)
    u_bsf = checkpoint_name(jax.nn.gelu(u_bsf, approximate=True), FFN_ACT)
    mlp_bsh = row_dense(sh, u_bsf, GEMM_SPECS["fc2_w"], weight(p, "fc2_w"), p["fc2_b"])
    x_bsh = x_bsh + dropout(mlp_bsh, cfg.dropout, fold_rows(key_rows, 1))
    return sh.constrain(x_bsh, ACT)


def logits(embed_p, head_p, x_bsh, cfg, sh):
    """Final LayerNorm, then logits through the tied (vocab-parallel) embedding."""
    y = gather_seq(sh, layer_norm(x_bsh, head_p["lnf_scale"], head_p["lnf_bias"], cfg.norm_eps))
    return sh.constrain(jnp.einsum("bsh,vh->bsv", y, embed_p["wte"]), ("batch", "seq", "vocab"))
