"""Hugging Face model folders (config.json and *.safetensors) read as ptdp_jax model settings
and canonical parameters: GPT2LMHeadModel (tanh GeLU, tied embeddings) and LlamaForCausalLM
(grouped-query attention, LLaMA-3.1's llama3 rope scaling; no biases). Anything else is a
ValueError naming the setting. Used by ptdp-import-hf (ptdp_jax/interop/hf_import.py) and by
checkpoint.load_weights (weights.py); nothing here writes."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ptdp_jax.config.load import load_config


def _load_tensors(hf_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{hf_dir} has no *.safetensors file (only safetensors are read, "
                         f"never pickled PyTorch files)")
    out = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except Exception as e:          # SafetensorError (a truncated or damaged file)
            raise ValueError(f"{f} cannot be read as safetensors: {' '.join(str(e).split())}") \
                from None
        for k, v in tensors.items():
            out[k] = np.asarray(v, np.float32) if v.dtype != np.float32 else v
    return out


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    return np.concatenate([x, np.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)])


def _need(ok: bool, msg: str):
    if not ok:
        raise ValueError(msg)


def gpt_model(conf: dict) -> dict:
    """The model.* settings of a GPT2LMHeadModel config.json; ValueError for what is not
    supported."""
    _need(conf.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh"),
          f"GPT-2 activation_function={conf.get('activation_function')!r}: only the tanh GeLU "
          f"(gelu_new) is supported")
    _need(not conf.get("scale_attn_by_inverse_layer_idx", False),
          "GPT-2 scale_attn_by_inverse_layer_idx=true is not supported")
    _need(conf.get("tie_word_embeddings", True), "GPT-2 with untied embeddings is not supported")
    h, n, L = conf["n_embd"], conf["n_head"], conf["n_layer"]
    f = conf.get("n_inner") or 4 * h
    model = {"model.arch": "gpt", "model.num_layers": L, "model.hidden_size": h,
             "model.num_heads": n, "model.ffn_hidden_size": f, "model.vocab_size": conf["vocab_size"],
             "model.seq_len": conf["n_positions"],
             "model.norm_eps": conf.get("layer_norm_epsilon", 1e-5)}
    return model


def gpt_from_hf(conf: dict, t: dict) -> tuple[dict, dict]:
    model = gpt_model(conf)
    h, n, L = conf["n_embd"], conf["n_head"], conf["n_layer"]
    d = h // n
    pre = "transformer." if "transformer.wte.weight" in t else ""
    g = lambda name: t[pre + name]
    stack = lambda fmt, fn=lambda x: x: np.stack([fn(g(fmt.format(i))) for i in range(L)])
    layers = {
        "ln1_scale": stack("h.{}.ln_1.weight"), "ln1_bias": stack("h.{}.ln_1.bias"),
        **{f"{c}_w": stack("h.{}.attn.c_attn.weight", lambda x, j=j: x.reshape(h, 3, n, d)[:, j])
           for j, c in enumerate("qkv")},
        **{f"{c}_b": stack("h.{}.attn.c_attn.bias", lambda x, j=j: x.reshape(3, n, d)[j])
           for j, c in enumerate("qkv")},
        "out_w": stack("h.{}.attn.c_proj.weight", lambda x: x.reshape(n, d, h)),
        "out_b": stack("h.{}.attn.c_proj.bias"),
        "ln2_scale": stack("h.{}.ln_2.weight"), "ln2_bias": stack("h.{}.ln_2.bias"),
        "fc1_w": stack("h.{}.mlp.c_fc.weight"), "fc1_b": stack("h.{}.mlp.c_fc.bias"),
        "fc2_w": stack("h.{}.mlp.c_proj.weight"), "fc2_b": stack("h.{}.mlp.c_proj.bias"),
    }
    params = {"embed": {"wte": g("wte.weight"), "wpe": g("wpe.weight")}, "layers": layers,
              "head": {"lnf_scale": g("ln_f.weight"), "lnf_bias": g("ln_f.bias")}}
    return model, params


def llama_model(conf: dict) -> dict:
    """The model.* settings of a LlamaForCausalLM config.json; ValueError for what is not
    supported."""
    h, n, L = conf["hidden_size"], conf["num_attention_heads"], conf["num_hidden_layers"]
    d = conf.get("head_dim") or h // n
    kv = conf.get("num_key_value_heads") or n
    _need(n % kv == 0, f"LLaMA num_attention_heads={n} is not a multiple of "
                       f"num_key_value_heads={kv}")
    _need(d * n == h, f"LLaMA head_dim={d} x heads={n} != hidden_size={h} is not supported")
    _need(not conf.get("attention_bias") and not conf.get("mlp_bias"),
          "LLaMA with attention or MLP biases is not supported")
    _need(conf.get("hidden_act", "silu") == "silu", f"LLaMA hidden_act={conf.get('hidden_act')!r}")
    V = conf["vocab_size"]
    model = {"model.arch": "llama", "model.num_layers": L, "model.hidden_size": h,
             "model.num_heads": n, "model.ffn_hidden_size": conf["intermediate_size"],
             "model.vocab_size": V, "model.seq_len": conf.get("max_position_embeddings", 2048),
             "model.norm_eps": conf.get("rms_norm_eps", 1e-6), **llama_rope(conf)}
    if kv != n:
        model["model.num_kv_heads"] = kv
    return model


LLAMA3_KEYS = {"factor": "model.rope_scaling_factor",
               "low_freq_factor": "model.rope_low_freq_factor",
               "high_freq_factor": "model.rope_high_freq_factor",
               "original_max_position_embeddings": "model.rope_original_seq_len"}


def llama_rope(conf: dict) -> dict:
    """The model.rope_* settings of a LLaMA config.json, read as transformers reads them:
    rope_theta, and rope_scaling (4.x) or rope_parameters (5.x) of rope_type default or llama3
    (LLaMA-3.1's scaling); ValueError for another rope_type or a partial rotary embedding."""
    rope = conf.get("rope_scaling") or conf.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    partial = rope.get("partial_rotary_factor") or conf.get("partial_rotary_factor") or 1.0
    _need(partial == 1, f"LLaMA partial_rotary_factor={partial} is not supported")
    theta = {"model.rope_theta": rope.get("rope_theta", conf.get("rope_theta", 10000.0))}
    if kind == "default":
        return theta
    _need(kind == "llama3", f"LLaMA rope_type={kind!r} is not supported (only default and "
                            f"llama3, LLaMA-3.1's rope scaling)")
    original = conf.get("original_max_position_embeddings", rope.get(
        "original_max_position_embeddings", conf.get("max_position_embeddings", 2048)))
    rope = {**rope, "original_max_position_embeddings": original}
    missing = [k for k in LLAMA3_KEYS if k not in rope]
    _need(not missing, f"LLaMA rope_type='llama3' without {', '.join(missing)}")
    return {**theta, **{ours: rope[k] for k, ours in LLAMA3_KEYS.items()}}


def llama_from_hf(conf: dict, t: dict) -> tuple[dict, dict]:
    model = llama_model(conf)
    h, n, L = conf["hidden_size"], conf["num_attention_heads"], conf["num_hidden_layers"]
    d = conf.get("head_dim") or h // n
    kv = conf.get("num_key_value_heads") or n
    g = lambda name: t[name]
    stack = lambda fmt, fn: np.stack([fn(g(fmt.format(i))) for i in range(L)])
    p = "model.layers.{}."
    layers = {
        "attn_norm": stack(p + "input_layernorm.weight", lambda x: x),
        "wq": stack(p + "self_attn.q_proj.weight", lambda x: x.T.reshape(h, n, d)),
        "wk": stack(p + "self_attn.k_proj.weight", lambda x: x.T.reshape(h, kv, d)),
        "wv": stack(p + "self_attn.v_proj.weight", lambda x: x.T.reshape(h, kv, d)),
        "wo": stack(p + "self_attn.o_proj.weight", lambda x: x.T.reshape(n, d, h)),
        "mlp_norm": stack(p + "post_attention_layernorm.weight", lambda x: x),
        "w_gate": stack(p + "mlp.gate_proj.weight", lambda x: x.T),
        "w_up": stack(p + "mlp.up_proj.weight", lambda x: x.T),
        "w_down": stack(p + "mlp.down_proj.weight", lambda x: x.T),
    }
    tok = g("model.embed_tokens.weight")
    out = t.get("lm_head.weight", tok if conf.get("tie_word_embeddings") else None)
    _need(out is not None, "LLaMA checkpoint has no lm_head.weight")
    params = {"embed": {"tok": tok}, "layers": layers,
              "head": {"norm": g("model.norm.weight"), "out": out.T}}
    return model, params


CONVERTERS = {"gpt2": (gpt_model, gpt_from_hf), "llama": (llama_model, llama_from_hf)}


def _read_conf(hf_dir: Path) -> dict:
    """config.json of a Hugging Face directory of a supported model_type; ValueError else."""
    conf_path = hf_dir / "config.json"
    if not hf_dir.is_dir():
        what = "is not a folder" if hf_dir.exists() else "does not exist"
        raise ValueError(f"{hf_dir} {what}: give the folder of a Hugging Face model (its "
                         f"config.json and *.safetensors)")
    if not conf_path.is_file():
        raise ValueError(f"{hf_dir} has no config.json")
    try:
        conf = json.loads(conf_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{conf_path} cannot be read as JSON: {e}") from None
    if not isinstance(conf, dict) or conf.get("model_type") not in CONVERTERS:
        kind = conf.get("model_type") if isinstance(conf, dict) else None
        raise ValueError(f"{conf_path}: model_type={kind!r}; only gpt2 and llama are supported")
    return conf


def hf_model(hf_dir: str | os.PathLike) -> dict:
    """The model.* settings of a Hugging Face directory, from its config.json alone (no
    tensor is read); ValueError for a directory that cannot be imported."""
    hf_dir = Path(hf_dir)
    conf = _read_conf(hf_dir)
    try:
        return CONVERTERS[conf["model_type"]][0](conf)
    except KeyError as e:
        raise ValueError(f"{hf_dir}: missing config key {e}") from None


def check_tensor_files(hf_dir: str | os.PathLike) -> None:
    """ValueError naming a *.safetensors file of `hf_dir` whose header cannot be read (or
    where there is none); reads no tensor data."""
    from safetensors import safe_open
    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{hf_dir} has no *.safetensors file (only safetensors are read, "
                         f"never pickled PyTorch files)")
    for f in files:
        try:
            with safe_open(str(f), framework="numpy") as handle:
                handle.keys()
        except Exception as e:          # SafetensorError (a truncated or damaged file)
            raise ValueError(f"{f} cannot be read as safetensors: {' '.join(str(e).split())}") \
                from None


def import_hf(hf_dir: str | os.PathLike) -> tuple[dict, dict]:
    """(model.* overrides, canonical parameters with the vocabulary padded) of a
    Hugging Face directory."""
    hf_dir = Path(hf_dir)
    conf = _read_conf(hf_dir)
    tensors = _load_tensors(hf_dir)
    try:
        model, params = CONVERTERS[conf["model_type"]][1](conf, tensors)
    except KeyError as e:
        raise ValueError(f"{hf_dir}: missing tensor or config key {e}") from None
    mcfg = load_config(None, model).model
    Vp = mcfg.padded_vocab_size
    if mcfg.arch == "gpt":
        params["embed"]["wte"] = _pad_rows(params["embed"]["wte"], Vp)
    else:
        params["embed"]["tok"] = _pad_rows(params["embed"]["tok"], Vp)
        params["head"]["out"] = _pad_rows(params["head"]["out"].T, Vp).T
    from ptdp_jax.models.model import param_shapes
    import jax
    want = param_shapes(mcfg)
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    _need(got == want, f"{hf_dir}: tensor shapes {got} do not match the model {want}")
    params = jax.tree.map(lambda x: np.ascontiguousarray(x, np.float32), params)
    return model, params
