"""`ptdp-import-hf HF_DIR CHECKPOINT_DIR [key=value ...]`: a Hugging Face GPT-2 or
LLaMA directory (config.json + *.safetensors) as a ptdp_jax checkpoint at step 0.

The inverse of ptdp_jax.interop.export. Beside the checkpoint it writes CHECKPOINT_DIR.yaml (the
model.* settings and checkpoint.dir), so that training continues from it with one command:

    ptdp-import-hf ./gpt2-small ckpt/            # writes ckpt/0 and ckpt.yaml
    ptdp-train ckpt.yaml --mesh 2,2,2 train.lr=1e-4 data.path=[data/mycorpus]

The checkpoint holds the parameters (vocabulary padded to a multiple of 128 with
zero rows), a fresh optimizer state, step 0, and the config: the model settings
read from config.json. Overrides: model.dropout and model.init_std
are taken; model.seq_len may be shortened (GPT: the position table is cut); any other
model.* key must agree with config.json, and train.*, data.*, parallel.*, ... belong
to ptdp-train (which does not read them from the checkpoint): each of those is a
ConfigError naming it, and nothing is written (nor if CHECKPOINT_DIR.yaml exists). Supported: GPT2LMHeadModel with gelu_new
and tied embeddings; LlamaForCausalLM, with grouped-query attention
(num_key_value_heads), without rope scaling or biases. Anything else is a ValueError
naming the setting.

    ptdp-import-hf ./llama ckpt/ model.dropout=0.1
    ptdp-train ckpt.yaml train.lr=1e-4
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.paths import unwritable


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


def gpt_from_hf(conf: dict, t: dict) -> tuple[dict, dict]:
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


def llama_from_hf(conf: dict, t: dict) -> tuple[dict, dict]:
    h, n, L = conf["hidden_size"], conf["num_attention_heads"], conf["num_hidden_layers"]
    d = conf.get("head_dim") or h // n
    kv = conf.get("num_key_value_heads") or n
    _need(n % kv == 0, f"LLaMA num_attention_heads={n} is not a multiple of "
                       f"num_key_value_heads={kv}")
    _need(d * n == h, f"LLaMA head_dim={d} x heads={n} != hidden_size={h} is not supported")
    rope = conf.get("rope_parameters") or {}
    _need(not conf.get("rope_scaling") and rope.get("rope_type", "default") == "default",
          f"LLaMA rope scaling {conf.get('rope_scaling') or rope} is not supported")
    _need(not conf.get("attention_bias") and not conf.get("mlp_bias"),
          "LLaMA with attention or MLP biases is not supported")
    _need(conf.get("hidden_act", "silu") == "silu", f"LLaMA hidden_act={conf.get('hidden_act')!r}")
    V = conf["vocab_size"]
    model = {"model.arch": "llama", "model.num_layers": L, "model.hidden_size": h,
             "model.num_heads": n, "model.ffn_hidden_size": conf["intermediate_size"],
             "model.vocab_size": V, "model.seq_len": conf.get("max_position_embeddings", 2048),
             "model.norm_eps": conf.get("rms_norm_eps", 1e-6),
             "model.rope_theta": rope.get("rope_theta", conf.get("rope_theta", 10000.0))}
    if kv != n:
        model["model.num_kv_heads"] = kv
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


def import_hf(hf_dir: str | os.PathLike) -> tuple[dict, dict]:
    """(model.* overrides, canonical parameters with the vocabulary padded) of a
    Hugging Face directory."""
    hf_dir = Path(hf_dir)
    conf_path = hf_dir / "config.json"
    if not hf_dir.is_dir():
        what = "is not a folder" if hf_dir.exists() else "does not exist"
        raise ValueError(f"{hf_dir} {what}: give the folder of a Hugging Face model (its "
                         f"config.json and *.safetensors)")
    if not conf_path.is_file():
        raise ValueError(f"{hf_dir} has no config.json")
    conf = json.loads(conf_path.read_text())
    kind = conf.get("model_type")
    tensors = _load_tensors(hf_dir)
    try:
        if kind == "gpt2":
            model, params = gpt_from_hf(conf, tensors)
        elif kind == "llama":
            model, params = llama_from_hf(conf, tensors)
        else:
            raise ValueError(f"{conf_path}: model_type={kind!r}; only gpt2 and llama are supported")
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


FREE_MODEL_KEYS = ("model.dropout", "model.init_std")


def import_config(model: dict, overrides: dict, params: dict):
    """(Config, params) of an import: the model settings of config.json with the
    overrides that can be honoured (see the module doc); ConfigError for the others."""
    from ptdp_jax.config.load import _apply, Config, migrate
    source = load_config(None, model)
    overrides = migrate(overrides)[0]            # keys of earlier versions: their new names
    refused = []
    for key, value in overrides.items():
        section = key.split(".", 1)[0]
        if section != "model":
            try:
                _apply(Config(), {key: value})
            except ConfigError as e:
                raise ConfigError(str(e)) from None
            refused.append(f"{key}: ptdp-import-hf writes the model only and ptdp-train does "
                           f"not read {section}.* from a checkpoint; give it to ptdp-train")
            continue
        got = getattr(load_config(None, {**model, key: value}).model, key.split(".", 1)[1])
        want = getattr(source.model, key.split(".", 1)[1])
        if key in FREE_MODEL_KEYS or got == want:
            continue
        if key == "model.seq_len" and (source.model.arch == "llama" or got <= want):
            continue
        if key == "model.seq_len":
            refused.append(f"model.seq_len={got}: the source has {want} learned positions; it "
                           f"can only be shortened")
        elif key in model:
            refused.append(f"{key}={got}: the source ({key.split('.')[1]} from config.json) has "
                           f"{want}; a converted model keeps the source's shape")
        else:
            refused.append(f"{key}={got}: not a setting a converted model can change (only "
                           f"{', '.join(FREE_MODEL_KEYS)} and a shorter model.seq_len)")
    if refused:
        raise ConfigError("ptdp-import-hf cannot honour " + "; ".join(refused))
    cfg = load_config(None, {**model, **overrides})
    if cfg.model.arch == "gpt" and cfg.model.seq_len < source.model.seq_len:
        params = dict(params, embed=dict(params["embed"],
                                         wpe=params["embed"]["wpe"][: cfg.model.seq_len]))
    return cfg, params


def hf_tokenizer(hf_dir: str | os.PathLike, vocab_size: int) -> str | None:
    """The source's tokenizer.json where ptdp_jax can use it (an end-of-document token,
    no more ids than the model), else None."""
    from ptdp_jax.data.tokenizer import load_tokenizer
    path = Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        tok = load_tokenizer(str(path))
    except Exception:               # tokenizers raises plain Exceptions for a file it rejects
        return None
    return str(path.resolve()) if tok.vocab_size <= vocab_size else None


def write_checkpoint(cfg, params, directory: str | os.PathLike,
                     tokenizer: str | None = None) -> Path:
    """A step-0 checkpoint of canonical `params` (fresh optimizer state) in `directory`,
    keeping `tokenizer` (a tokenizer.json, or None)."""
    import jax
    import jax.numpy as jnp
    from dataclasses import replace

    from ptdp_jax.checkpoint.manager import CheckpointManager
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import make_optimizer, state_from_params, state_shardings

    cfg = replace(cfg, parallel=replace(cfg.parallel, data=1, pipe=1, tensor=1,
                                        schedule="1f1b", virtual_stages=1),
                  checkpoint=replace(cfg.checkpoint, dir=str(directory), resume=False))
    tx, _ = make_optimizer(cfg)
    shardings = state_shardings(cfg, make_mesh((1, 1, 1)), tx)
    manager = CheckpointManager(cfg, shardings)
    manager.tokenizer = tokenizer
    if manager.steps():
        raise ValueError(f"{directory} already holds checkpoints (steps {manager.steps()}); "
                         f"import into a new or empty directory")
    state = jax.jit(lambda prm: state_from_params(cfg, tx, prm), out_shardings=shardings)(
        jax.tree.map(jnp.asarray, params))
    with manager:
        manager.save(0, state)
    return Path(directory) / "0"


def check_destination(checkpoint_dir: str | os.PathLike) -> None:
    """Before anything is read: ValueError naming the folder where CHECKPOINT_DIR, or the
    CHECKPOINT_DIR.yaml beside it, cannot be written (paths.unwritable), or that YAML exists."""
    yaml_path = config_path(checkpoint_dir)
    if yaml_path.exists():
        raise ValueError(f"{yaml_path} exists; ptdp-import-hf writes the model's config "
                         f"there: move it away, or import into another directory")
    for folder in (Path(os.path.expanduser(checkpoint_dir)).absolute(), yaml_path.parent):
        why = unwritable(folder)
        if why:
            raise ValueError(f"{checkpoint_dir}: {folder} {why}")


def config_path(checkpoint_dir: str | os.PathLike) -> Path:
    """The YAML file written beside an imported checkpoint: CHECKPOINT_DIR.yaml."""
    d = Path(os.path.expanduser(checkpoint_dir)).absolute()
    return d.with_name(d.name + ".yaml")


def write_config(model: dict, overrides: dict, checkpoint_dir, hf_dir) -> Path:
    """CHECKPOINT_DIR.yaml: the model.* settings of the import and the absolute
    checkpoint.dir; `ptdp-train` of it resumes from the imported step 0."""
    import yaml
    settings = {k.split(".", 1)[1]: v for k, v in {**model, **overrides}.items()
                if k.startswith("model.")}
    tree = {"model": settings,
            "checkpoint": {"dir": str(Path(os.path.expanduser(checkpoint_dir)).absolute())}}
    path = config_path(checkpoint_dir)
    path.write_text(f"# ptdp-import-hf {hf_dir}: the model of this checkpoint; add train.*, "
                    f"data.* and --mesh\n" + yaml.safe_dump(tree, sort_keys=False))
    return path


def _shown(path: Path) -> str:
    """`path` relative to the working directory where it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
