"""One typed, frozen config tree: defaults in code, YAML overrides, dotted overrides.

    cfg = load_config("configs/demo.yaml", overrides={"train.steps": 10})
    cfg.model.hidden_size, cfg.parallel.mesh_shape, cfg.num_microbatches

Every constraint is checked by `validation.validate(cfg, num_devices)` before anything is
compiled; a violation raises `ConfigError` (a ValueError) naming the key and the numbers.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml


class ConfigError(ValueError):
    """A bad configuration value; the message names the key and the numbers."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "gpt"                    # gpt | llama
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int | None = None      # llama: key/value heads (grouped-query attention); None: num_heads
    ffn_hidden_size: int | None = None   # None: 4h for gpt, 2/3*4h rounded up to 256 for llama
    vocab_size: int = 257                # the byte tokenizer's 256 bytes + end-of-document
    seq_len: int = 128
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02
    attention: str = "auto"              # auto (cudnn on GPU, xla elsewhere) | xla | cudnn

    @property
    def ffn(self) -> int:
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.arch == "llama":
            return 256 * math.ceil(int(2 * 4 * self.hidden_size / 3) / 256)
        return 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        """Key/value heads: num_kv_heads, or num_heads (no grouped-query attention)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary padded to a multiple of 128 (Megatron); layout independent
        so parameters are the same whatever the tensor-parallel size."""
        return 128 * math.ceil(self.vocab_size / 128)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200                     # the run ends after this many steps (of the whole run)
    decay_steps: int | None = None       # length of the cosine (warm-up included); None: train.steps
    stop_at_step: int = 0                # stop early (checkpoint, exit 0) at this step; 0: never
    stop_after_minutes: float = 0.0      # stop (checkpoint, exit 0) after this long; 0: never
    skip_memory_check: bool = False      # do not refuse a run the memory estimate says cannot fit
    global_batch_size: int = 16
    micro_batch_size: int = 4
    lr: float = 3e-3
    min_lr_ratio: float = 0.1            # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    dtype: str = "float32"               # float32 | bfloat16 (bf16 compute, fp32 master weights)
    recompute: str = "none"              # none | selective | full
    keep_ffn_activation: bool | str = "auto"  # selective (auto: on): keep the MLP activation,
                                         # not run again in the backward (2 T f bytes a layer)
    scan_layers: bool | str = "auto"     # p = 1: scan over layers (compiles faster for deep models;
                                         # runs slower: residuals stacked and copied per layer).
                                         # auto: only with parallel.zero=3 (Config.scan_layers_on)
    eval_every: int = 50                 # 0: never
    eval_batches: int = 2
    log_every: int = 1
    max_bad_steps: int = 5               # consecutive non-finite steps before the run stops
    sample_tokens: int = 0               # length of the sample printed at the end (0: none)
    sample_prompt: str = "The "
    sample_temperature: float = 0.0      # 0: greedy
    sample_top_k: int = 0                # sample among the k likeliest tokens (0: all)

    @property
    def keeps_ffn_activation(self) -> bool:
        """keep_ffn_activation resolved (true or auto): selective keeps the activation."""
        return self.keep_ffn_activation in (True, "auto")

    @property
    def remat(self) -> str:
        """The layers' policy (models/model.py REMAT_POLICIES): recompute or selective+act."""
        keep = self.recompute == "selective" and self.keeps_ffn_activation
        return "selective+act" if keep else self.recompute


STATIC_STASH_AUTO = ("1f1b", "1f1b-phased", "zb-phased")    # parallel.static_stash=auto: on for these


@dataclass(frozen=True)
class ParallelConfig:
    data: int = 1
    pipe: int = 1
    tensor: int = 1
    schedule: str = "1f1b"               # gpipe | 1f1b | 1f1b-phased | interleaved | zb-h1 | zb-v | zb-phased
    virtual_stages: int = 1              # model chunks a stage: interleaved, 1f1b-phased (v > 1), zb-v (2)
    scatter_gather: bool = False
    sequence_parallel: bool = False      # split norms, dropout, residual stream by sequence over
                                         # 'tensor' (Megatron's --sequence-parallel); t = 1: no-op
    tp_comm_overlap: bool = False        # with sequence_parallel: its all-gathers and reduce-scatters
                                         # decomposed into rings of permutes around the GEMMs
                                         # (collective matmul, Megatron's --tp-comm-overlap)
    # Layers of each model chunk, p x v counts in chunk order (chunk c on stage c % p; zb-v: stage c
    # for c < p, 2p-1-c after), summing to num_layers; () = even; "auto" = balanced with the head.
    stage_layers: tuple[int, ...] | str = ()
    allow_cross_host_tensor: bool = False  # multi-process: let 'tensor' span hosts (warns; slow)
    layout: str = "manual"               # manual | auto: ptdp-plan's best layout for the devices
                                         # at hand (keys given as overrides or --mesh still win)
    zero: int = 0                        # 0: state replicated over 'data'; 1: distributed optimizer
                                         # (fp32 master weights and AdamW moments split over 'data');
                                         # 2: also the gradients, reduce-scattered in every
                                         # microbatch's backward (ZeRO-2); 3: also the weights,
                                         # gathered layer by layer (ZeRO-3, FSDP)
    grad_reduce_dtype: str = "float32"   # float32 | bfloat16: the data-parallel gradient reduction
    overlap_grad_reduce: bool | str = "auto"  # ZeRO's reduce-scatters inside the last microbatch's
                                         # backward, layer by layer (true), or once after the
                                         # backward (false; Megatron's default). auto: true for
                                         # zero 1, 2 and 3 without pipelining, false otherwise (see
                                         # overlap_grad_reduce_on)
    static_stash: bool | str = "auto"    # pipelines: a switch branch per (op, residual stash slot),
                                         # so layers write and read residuals in place (no
                                         # per-tick stash copies: 1-16% faster steps on 2x H100,
                                         # less memory; more branches to compile). auto: on for
                                         # 1f1b and 1f1b-phased (see static_stash_on)
    empty_buffers: bool = True           # pipelines, 'tensor' 1: stash and message buffers
                                         # uninitialised (no zero fill and copy a step)
    overlap_p2p: bool | str = "auto"     # phased: a forward row's message filed after the
                                         # backward row's op, its permute under that op. auto:
                                         # on for 1f1b-phased and zb-phased with pipe > 1

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.data, self.pipe, self.tensor)

    @property
    def overlap_grad_reduce_on(self) -> bool:
        """overlap_grad_reduce resolved. Only ZeRO without pipelining reduces inside the
        backward: zero=2 and 3 always (a layer's full gradient never outlives it), zero=1
        unless false; zero=0 and pipelines reduce after the backward (zero=0's all-reduce per
        layer measured slower: benchmarks/NOTES.md, issue 10)."""
        if self.zero == 0 or self.pipe > 1:
            return False
        return self.zero in (2, 3) or self.overlap_grad_reduce in (True, "auto")

    @property
    def overlap_p2p_on(self) -> bool:
        """overlap_p2p resolved: true, or auto where the schedule is a phased one."""
        phased = self.pipe > 1 and self.schedule in ("1f1b-phased", "zb-phased")
        return self.overlap_p2p is True or (self.overlap_p2p == "auto" and phased)

    @property
    def static_stash_on(self) -> bool:
        """static_stash resolved. auto: on where the branches stay few, 1f1b and the phased tables
        (p = 4: 20 and 26 branches against 7 and 6); off for gpipe (its slots, so its
        branches, grow with m), interleaved and zb-v (branches x v x slots: 81 and 48 at
        p = 4, v = 2; the compile took 3.4x and 2.1x as long at p = 2) and zb-h1 (not measured)."""
        if self.static_stash == "auto":
            return self.schedule in STATIC_STASH_AUTO
        return bool(self.static_stash)

    @property
    def stash_chunk_pools(self) -> bool:
        """The stash slots in a pool per local chunk (Schedule.chunk_pools): with the static
        stash at v > 1, where one shared pool would give a branch per (op, chunk, slot)."""
        return self.static_stash_on and self.virtual_stages > 1


@dataclass(frozen=True)
class DataConfig:
    path: tuple[str, ...] = ()           # token-file prefixes (ptdp-prepare-data); empty: embedded corpus
    weights: tuple[float, ...] = ()      # blend weights, one per path (empty: equal)
    cache_dir: str = "~/.cache/ptdp_jax"
    val_fraction: float = 0.05


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = ""                        # empty: no checkpoints
    every: int = 0                       # 0: only at the end
    keep: int = 3
    resume: bool = True
    overwrite: bool = False              # resume=false: remove an earlier run's checkpoints in dir


@dataclass(frozen=True)
class RunConfig:
    dir: str = "runs/latest"             # metrics.jsonl and TensorBoard events
    progress: bool = True
    tensorboard: bool = True
    compile_cache: bool | str = "auto"   # auto (true) | false (off) | DIR: compiled steps on disk


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def scan_layers_on(self) -> bool:
        """train.scan_layers resolved. auto: a scan for zero=3 without pipelining (one layer's
        weights gathered at a time, bounded by the scan, not by XLA's scheduler), the layers
        unrolled otherwise (faster: no stacked residual copies, benchmarks/NOTES.md issue 12).
        false with zero=3: the layers unrolled, each gathering its own weights."""
        if self.train.scan_layers == "auto":
            return self.parallel.zero == 3 and self.parallel.pipe == 1
        return bool(self.train.scan_layers)

    @property
    def num_microbatches(self) -> int:
        t = self.train
        return t.global_batch_size // (t.micro_batch_size * self.parallel.data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CHOICES = {
    "model.arch": ("gpt", "llama"),
    "model.attention": ("auto", "xla", "cudnn"),
    "train.dtype": ("float32", "bfloat16"),
    "train.recompute": ("none", "selective", "full"),
    "parallel.schedule": ("gpipe", "1f1b", "1f1b-phased", "interleaved", "zb-h1", "zb-v",
                          "zb-phased"),
    "parallel.layout": ("manual", "auto"),
    "parallel.zero": (0, 1, 2, 3),
    "parallel.grad_reduce_dtype": ("float32", "bfloat16"),
}


# ----------------------------------------------------------------------------- overrides

def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Turn a YAML/CLI value into the field's type, or raise ConfigError."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):           # X | None, X | str
        if type(None) in args and (value is None or (isinstance(value, str)
                                                     and value.lower() in ("none", "null"))):
            return None
        options = [a for a in args if a is not type(None)]
        for i, option in enumerate(options):
            try:
                return _coerce(key, value, option)
            except ConfigError:
                if i == len(options) - 1:
                    raise
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(_coerce(key, v, args[0]) for v in value)
    try:
        if typ is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, str):
                value = float(value) if any(c in value for c in ".eE") else value
            return int(value)
        if typ is float:
            return float(value)
        if typ is str:
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: cannot read {value!r} as {typ.__name__}") from None
    return value


def all_keys() -> list[str]:
    """Every dotted config key ('model.hidden_size', ...)."""
    cfg = Config()
    return [f"{f.name}.{name}" for f in fields(Config)
            for name in _field_types(type(getattr(cfg, f.name)))]


def did_you_mean(key: str) -> str:
    """' (did you mean 'train.steps'?)' for a near miss of a known key, else ''."""
    keys = all_keys()
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close and "." in key:                 # a right name in a wrong or misspelt section
        name = key.split(".", 1)[1]
        close = [k for k in keys if k.split(".", 1)[1] == name][:1] or \
            difflib.get_close_matches(name, [k.split(".", 1)[1] for k in keys], n=1, cutoff=0.75)
        close = [k for k in keys if k.split(".", 1)[1] in close][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _apply(cfg: Config, overrides: Mapping[str, Any], where=lambda key: "") -> Config:
    """Apply dotted overrides; `where(key)` prefixes an error's message (file and line)."""
    sections = {f.name: f.type for f in fields(Config)}
    updates: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        parts = key.split(".")
        if len(parts) != 2 or parts[0] not in sections:
            raise ConfigError(f"{where(key)}unknown config key {key!r}{did_you_mean(key)}; "
                              f"sections are {sorted(sections)}")
        section, name = parts
        types_ = _field_types(type(getattr(cfg, section)))
        if name not in types_:
            raise ConfigError(f"{where(key)}unknown config key {key!r}{did_you_mean(key)}; "
                              f"{section} has {sorted(types_)}")
        try:
            updates.setdefault(section, {})[name] = _coerce(key, value, types_[name])
        except ConfigError as e:
            raise ConfigError(f"{where(key)}{e}") from None
    return replace(cfg, **{s: replace(getattr(cfg, s), **u) for s, u in updates.items()})


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'hidden_size': 8}} -> {'model.hidden_size': 8}."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_mesh(text: str) -> tuple[int, int, int]:
    """'2,2,2' -> (2, 2, 2); ConfigError otherwise."""
    try:
        mesh = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise ConfigError(f"--mesh {text!r} is not three comma-separated ints") from None
    if len(mesh) != 3:
        raise ConfigError(f"--mesh {text!r} needs three sizes: data,pipe,tensor")
    if any(x < 1 for x in mesh):
        raise ConfigError(f"--mesh {text!r}: every size must be positive")
    return mesh


def parse_cli_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


def _yaml_lines(text: str) -> dict[str, int]:
    """Dotted key -> line number (1-based) of every key in a YAML text."""
    out: dict[str, int] = {}

    def walk(node, prefix):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}{k.value}"
                out[key] = k.start_mark.line + 1
                walk(v, key + ".")
    try:
        walk(yaml.compose(text, Loader=yaml.SafeLoader), "")
    except yaml.YAMLError:
        pass
    return out


def read_yaml(path: "str | os.PathLike") -> tuple[dict[str, Any], dict[str, int]]:
    """(dotted overrides, key -> line) of a config file; ConfigError naming the file and
    line for anything that is not a YAML mapping of sections."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory; give a YAML file "
                          f"(e.g. configs/demo.yaml)")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {e}") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"config file {str(path)!r}{where}: YAML syntax error: {what}") from None
    tree = tree or {}
    if not isinstance(tree, Mapping):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections "
                          f"(model:, train:, ...), not a {type(tree).__name__}")
    lines = _yaml_lines(text)
    sections = {f.name: f.type for f in fields(Config)}
    for name, value in tree.items():
        if name in sections and not isinstance(value, Mapping) and value is not None:
            example = next(iter(_field_types(type(getattr(Config(), name)))))
            raise ConfigError(
                f"config file {str(path)!r}, line {lines.get(str(name), '?')}: section {name!r} "
                f"must be a mapping of keys (indented lines such as '  {example}: ...' under "
                f"'{name}:'), got {value!r}")
    flat = flatten({k: v for k, v in tree.items() if v is not None or k not in sections})
    return flat, lines


def load_config(config: "str | os.PathLike | Config | None" = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then a YAML file (or a Config), then dotted overrides."""
    if isinstance(config, Config):
        cfg = config
    else:
        cfg = Config()
        if config is not None:
            flat, lines = read_yaml(config)
            cfg = _apply(cfg, flat, lambda key: f"config file {str(config)!r}, line "
                                                f"{lines.get(key, '?')}: ")
    return _apply(cfg, dict(overrides or {}))


def to_yaml(cfg: Config) -> str:
    """The whole resolved config as YAML (load_config of it gives cfg back)."""
    return yaml.safe_dump(json.loads(json.dumps(cfg.to_dict())), sort_keys=False)
