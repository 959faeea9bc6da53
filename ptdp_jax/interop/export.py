"""`ptdp-export CHECKPOINT OUT_DIR`: a checkpoint as a Hugging Face model directory.

Writes ``config.json`` and ``model.safetensors`` (float32 unless --dtype says
otherwise) that ``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads:

- GPT as ``GPT2LMHeadModel``: activation ``gelu_new`` (our tanh-approximated
  GeLU), GPT-2's Conv1D weights are (in, out): ``q_w``, ``k_w``, ``v_w`` (h, n, d)
  become ``c_attn.weight`` (h, 3h), ``out_w`` (n, d, h) ``c_proj.weight`` (h, h); the
  output layer is tied to ``wte``.
- LLaMA as ``LlamaForCausalLM``: ``wq`` (h, n, d) becomes ``q_proj.weight``
  (n*d, h) and so on (``wk``/``wv`` (h, kv, d) with grouped-query attention:
  ``num_key_value_heads``); no q/k permutation is needed since our rotary embedding
  already uses Hugging Face's rotate-half convention; untied ``lm_head``; the model.rope_*
  scaling keys as ``rope_scaling`` of ``rope_type`` llama3 (LLaMA-3.1's).

With the weights comes the tokenizer of the training data, the copy the checkpoint keeps
(or, for older checkpoints, the data's own) (``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``), so that
``transformers.AutoTokenizer.from_pretrained(OUT_DIR)`` encodes text as training did:
a BPE dataset's own tokenizer.json, or for the byte tokenizer a byte-level BPE without
merges whose ids are the byte values (``<|endoftext|>`` = 256). ``--tokenizer`` names
it when the checkpoint's data is gone. Its ``<|endoftext|>`` id is bos, eos and pad in
``config.json`` and ``generation_config.json``, so that ``generate`` stops where training
data ended a document. Files are written with the usual permissions
(0644 under the default umask).

The vocabulary is unpadded to ``model.vocab_size`` rows. CHECKPOINT is a step
directory (``<checkpoint.dir>/<step>``) or a checkpoint.dir (its newest step). An
OUT_DIR that already holds an export is refused unless ``--overwrite``; one that is (or is
inside) a checkpoint.dir or a step directory, or holds other files, is refused always,
before anything is read or written.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ptdp_jax.checkpoint.format import checkpoint_kind
from ptdp_jax.paths import unwritable
from ptdp_jax.checkpoint.manager import checkpoint_tokenizer, load_params
from ptdp_jax.data.tokenizer import EOS_TOKEN

BYTE_EOS = 256          # the byte tokenizer's end-of-document id


def gpt_to_hf(mcfg, params) -> tuple[dict, dict]:
    """(config.json dict, {name: array}) of GPT2LMHeadModel."""
    h, n, d, f, V = mcfg.hidden_size, mcfg.num_heads, mcfg.head_dim, mcfg.ffn, mcfg.vocab_size
    e, L, hd = params["embed"], params["layers"], params["head"]
    t = {"transformer.wte.weight": e["wte"][:V], "transformer.wpe.weight": e["wpe"],
         "transformer.ln_f.weight": hd["lnf_scale"], "transformer.ln_f.bias": hd["lnf_bias"]}
    for i in range(mcfg.num_layers):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"] = L["ln1_scale"][i]
        t[p + "ln_1.bias"] = L["ln1_bias"][i]
        t[p + "attn.c_attn.weight"] = np.stack([L[f"{c}_w"][i] for c in "qkv"], 1).reshape(
            h, 3 * n * d)
        t[p + "attn.c_attn.bias"] = np.stack([L[f"{c}_b"][i] for c in "qkv"]).reshape(3 * n * d)
        t[p + "attn.c_proj.weight"] = L["out_w"][i].reshape(n * d, h)
        t[p + "attn.c_proj.bias"] = L["out_b"][i]
        t[p + "ln_2.weight"] = L["ln2_scale"][i]
        t[p + "ln_2.bias"] = L["ln2_bias"][i]
        t[p + "mlp.c_fc.weight"] = L["fc1_w"][i]
        t[p + "mlp.c_fc.bias"] = L["fc1_b"][i]
        t[p + "mlp.c_proj.weight"] = L["fc2_w"][i]
        t[p + "mlp.c_proj.bias"] = L["fc2_b"][i]
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": V, "n_positions": mcfg.seq_len, "n_ctx": mcfg.seq_len, "n_embd": h,
        "n_layer": mcfg.num_layers, "n_head": n, "n_inner": f,
        "activation_function": "gelu_new", "layer_norm_epsilon": mcfg.norm_eps,
        "resid_pdrop": mcfg.dropout, "embd_pdrop": mcfg.dropout, "attn_pdrop": mcfg.dropout,
        "initializer_range": mcfg.init_std, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "use_cache": True,
    }
    return config, t


def llama_to_hf(mcfg, params) -> tuple[dict, dict]:
    """(config.json dict, {name: array}) of LlamaForCausalLM."""
    h, n, d, f, V = mcfg.hidden_size, mcfg.num_heads, mcfg.head_dim, mcfg.ffn, mcfg.vocab_size
    kv = mcfg.kv_heads
    e, L, hd = params["embed"], params["layers"], params["head"]
    t = {"model.embed_tokens.weight": e["tok"][:V], "model.norm.weight": hd["norm"],
         "lm_head.weight": hd["out"][:, :V].T}
    for i in range(mcfg.num_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = L["attn_norm"][i]
        for ours, theirs, heads in (("wq", "q_proj", n), ("wk", "k_proj", kv), ("wv", "v_proj", kv)):
            t[p + f"self_attn.{theirs}.weight"] = L[ours][i].reshape(h, heads * d).T
        t[p + "self_attn.o_proj.weight"] = L["wo"][i].reshape(n * d, h).T
        t[p + "post_attention_layernorm.weight"] = L["mlp_norm"][i]
        t[p + "mlp.gate_proj.weight"] = L["w_gate"][i].T
        t[p + "mlp.up_proj.weight"] = L["w_up"][i].T
        t[p + "mlp.down_proj.weight"] = L["w_down"][i].T
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": V, "hidden_size": h, "intermediate_size": f,
        "num_hidden_layers": mcfg.num_layers, "num_attention_heads": n,
        "num_key_value_heads": kv, "head_dim": d, "hidden_act": "silu",
        "max_position_embeddings": mcfg.seq_len, "rms_norm_eps": mcfg.norm_eps,
        **llama_rope_config(mcfg), "attention_bias": False, "attention_dropout": mcfg.dropout,
        "mlp_bias": False, "initializer_range": mcfg.init_std, "tie_word_embeddings": False,
        "use_cache": True,
    }
    return config, t


def llama_rope_config(mcfg) -> dict:
    """config.json's rotary settings, for transformers 4.x (rope_theta, rope_scaling) and 5.x
    (rope_parameters): rope_type llama3 where model.rope_scaling_factor != 1, else default."""
    scaling = None
    if mcfg.rope_scaling_factor != 1:
        scaling = {"rope_type": "llama3", "factor": mcfg.rope_scaling_factor,
                   "low_freq_factor": mcfg.rope_low_freq_factor,
                   "high_freq_factor": mcfg.rope_high_freq_factor,
                   "original_max_position_embeddings": mcfg.rope_original_seq_len}
    parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": mcfg.rope_theta}
    return {"rope_theta": mcfg.rope_theta, "rope_scaling": scaling, "rope_parameters": parameters}


CONVERTERS = {"gpt": gpt_to_hf, "llama": llama_to_hf}
DTYPES = {"float32": np.float32, "bfloat16": "bfloat16", "float16": np.float16}


def byte_tokenizer_json() -> str:
    """The byte tokenizer (ids 0..255 are UTF-8 bytes, 256 ends a document) as a Hugging
    Face tokenizer.json: a byte-level BPE with no merges (GPT-2's byte-to-character map),
    so each byte is one token whose id is the byte's value."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # tokenizers maps bytes through GPT-2's table; rebuild it exactly (bytes_to_unicode)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    vocab[EOS_TOKEN] = BYTE_EOS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS_TOKEN])
    return tok.to_str(pretty=True)


def export_tokenizer(spec: str, out_dir: str | os.PathLike, model_max_length: int) -> None:
    """tokenizer.json (+ tokenizer_config.json, special_tokens_map.json) for `spec`:
    'byte' or the path of a BPE tokenizer.json."""
    from ptdp_jax.data.tokenizer import load_tokenizer
    out = Path(out_dir)
    if spec == "byte":
        text = byte_tokenizer_json()
    else:
        text = Path(spec).read_text(encoding="utf-8")
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    eos = load_tokenizer(spec).eos_token
    special = {"bos_token": eos, "eos_token": eos, "unk_token": eos, "pad_token": eos}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            **special}
    (out / "tokenizer_config.json").write_text(json.dumps(conf, indent=2) + "\n")


def _readable(path: Path) -> None:
    """rw-r--r-- under the process umask (safetensors writes its file 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def export_params(model_cfg, params, out_dir: str | os.PathLike, dtype: str = "float32",
                  tokenizer: str | None = None) -> Path:
    """Write a Hugging Face directory for canonical `params` of `model_cfg` (and the
    tokenizer `tokenizer`: 'byte' or a tokenizer.json path; None: no tokenizer)."""
    from safetensors.numpy import save_file

    if model_cfg.arch not in CONVERTERS:
        raise ValueError(f"cannot export model.arch={model_cfg.arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not one of {sorted(DTYPES)}")
    from ptdp_jax.data.tokenizer import load_tokenizer

    config, tensors = CONVERTERS[model_cfg.arch](model_cfg, params)
    # The tokenizer's end-of-document id is bos, eos and pad: without it transformers
    # falls back to its own defaults (GPT-2 50256, LLaMA 1 and 2), ids of other tokens.
    eos = None if tokenizer is None else load_tokenizer(tokenizer).eos_id
    ids = {} if eos is None else {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    config.update(ids)
    config["torch_dtype"] = config["dtype"] = dtype
    if dtype == "bfloat16":
        import ml_dtypes
        np_dtype = ml_dtypes.bfloat16
    else:
        np_dtype = DTYPES[dtype]
    tensors = {k: np.ascontiguousarray(np.asarray(v, np.float32).astype(np_dtype))
               for k, v in tensors.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _readable(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        (out / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
        export_tokenizer(tokenizer, out, model_cfg.seq_len)
    return out


EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json")


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """Before anything is read or written, FileExistsError naming `out_dir` where it is (or
    is inside) a ptdp_jax checkpoint, is a file, cannot take files (paths.unwritable: below a
    file, read-only), or holds files that are not an export's;
    or, unless `overwrite`, where it holds an export (one with a tokenizer rewrites every
    file of EXPORT_FILES, so --overwrite leaves nothing stale)."""
    out = Path(os.path.abspath(os.path.expanduser(out_dir)))
    for where in (out, out.parent):
        kind = checkpoint_kind(where)
        if kind:
            raise FileExistsError(f"{str(out_dir)!r} {'is' if where == out else 'is inside'} "
                                  f"{kind}: an export there would mix with its checkpoints; "
                                  f"give a new directory outside it")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{str(out_dir)!r} exists and is not a directory")
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    other = [name for name in names if name not in EXPORT_FILES]
    if other:
        shown = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
        raise FileExistsError(f"{str(out_dir)!r} holds files that are not an export ({shown}); "
                              f"give an empty or new directory (--overwrite replaces only an "
                              f"earlier export)")
    old = [name for name in EXPORT_FILES if name in names]
    if old and not overwrite:
        raise FileExistsError(f"{str(out_dir)!r} already holds an export ({', '.join(old)}); "
                              f"give --overwrite to replace it, or another directory")
    why = unwritable(out)                           # last: its probe file touches `out`
    if why:
        raise FileExistsError(f"{str(out_dir)!r}: {out} {why}")


def export_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
                      dtype: str = "float32", tokenizer: str | None = None,
                      overwrite: bool = False) -> Path:
    """Export a ptdp_jax checkpoint (step dir or checkpoint.dir) to a Hugging Face dir,
    with the tokenizer of its training data (or `tokenizer`: 'byte' or a tokenizer.json);
    an `out_dir` that is a checkpoint or holds other files is refused, and an export already
    in it unless `overwrite` (check_out_dir)."""
    from ptdp_jax.data.sources import model_tokenizer

    check_out_dir(out_dir, overwrite)               # before the checkpoint is read
    cfg, params = load_params(checkpoint)
    spec, _ = model_tokenizer(list(cfg.data.path), cfg.model.vocab_size, tokenizer,
                              checkpoint_tokenizer(checkpoint))
    return export_params(cfg.model, params, out_dir, dtype, tokenizer=spec)
