"""One typed, frozen config tree: defaults in code, YAML overrides, dotted overrides.

    cfg = load_config("configs/demo.yaml", overrides={"train.steps": 10})
    cfg.model.hidden_size, cfg.parallel.mesh_shape, cfg.num_microbatches

Keys of earlier versions load through `config.migrate` (MOVED, GONE, FIXED): one ConfigWarning a
config says what replaced them; a value that can no longer be honoured is a ConfigError.

Every constraint is checked by `validation.validate(cfg, num_devices)` before anything is
compiled; a violation raises `ConfigError` (a ValueError) naming the key and the numbers.
"""
from __future__ import annotations

import difflib
import json
import math
import numbers
import os
import types
import typing
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from ptdp_jax.config.schema import (CheckpointConfig, Config, ConfigError, DataConfig,  # noqa: F401
                                  ModelConfig, ParallelConfig, RunConfig, TrainConfig,
                                  TuningConfig)
from ptdp_jax.config.migrate import (FIXED, GONE, MOVED, ConfigWarning, migrate,  # noqa: F401
                                     warn_old_keys)

CHOICES = {
    "model.arch": ("gpt", "llama"),
    "train.dtype": ("auto", "float32", "bfloat16"),
    "train.recompute": ("auto", "none", "selective", "offload", "full"),
    "train.lr_schedule": ("cosine", "linear", "constant", "wsd"),
    "train.fp8_recipe": ("current", "delayed"),
    "parallel.schedule": ("gpipe", "1f1b", "1f1b-phased", "interleaved", "zb-h1", "zb-v",
                          "zb-phased"),
    "parallel.layout": ("manual", "auto"),
    "parallel.zero": (0, 1, 2, 3),
    "parallel.grad_reduce_dtype": ("float32", "bfloat16"),
    "checkpoint.resume": (True, False, "overwrite"),
    "tuning.attention": ("auto", "xla", "cudnn"),
}


# ----------------------------------------------------------------------------- overrides

def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read_int(value: Any) -> int:
    """An int (not a bool, not a float such as 2.0) or its digits ('16', as a list's item)."""
    if isinstance(value, str) and value.strip().lstrip("+-").replace("_", "").isdigit():
        return int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ValueError(value)


def _read_float(value: Any) -> float:
    """A finite number (not a bool) or its text ('3e-4': YAML 1.1 reads that as a string)."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise ValueError(value)
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(value)
    return out


def _read_bool(value: Any) -> bool:
    """A YAML bool, or the text true / false (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(value)


def _read_str(value: Any) -> str:
    """A string (or, from Python, a path object) only: a number, a bool, a list or a mapping
    is not one."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return value
    raise ValueError(value)


READERS = {int: _read_int, float: _read_float, bool: _read_bool, str: _read_str}
TYPE_NAMES = {bool: "bool (true or false)", float: "a finite float", str: "a string"}
ITEM_NAMES = {int: "ints", float: "finite floats", str: "strings"}


def _type_name(typ: Any) -> str:
    """A field's type in words: 'int', 'a list of ints', 'bool (true or false) or a string'."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is tuple:
        return f"a list of {ITEM_NAMES[args[0]]}"
    return TYPE_NAMES.get(typ, getattr(typ, "__name__", str(typ)))


def _read(value: Any, typ: Any) -> Any:
    """value as exactly `typ` (READERS; a union: its first option that reads it; a tuple:
    from a list, or from a comma-separated string as a command line gives one); ValueError
    otherwise."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        for option in (a for a in args if a is not type(None)):
            try:
                return _read(value, option)
            except ValueError:
                pass
        raise ValueError(value)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(value)
        return tuple(_read(v, args[0]) for v in value)
    return READERS[typ](value)


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """A YAML/CLI value as exactly the field's type (`_read`), or ConfigError naming the key,
    the value and the type wanted. The one place where a config value gets its type."""
    try:
        return _read(value, typ)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key}: cannot read {value!r} as {_type_name(typ)}") from None


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
    """Apply dotted overrides; `where(key)` prefixes an error's message (file and line). A
    None (YAML null) unsets its key: the key's default."""
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
        default = getattr(type(getattr(cfg, section))(), name)
        try:
            updates.setdefault(section, {})[name] = default if value is None else \
                _coerce(key, value, types_[name])
        except ConfigError as e:
            raise ConfigError(f"{where(key)}{e}") from None
    return replace(cfg, **{s: replace(getattr(cfg, s), **u) for s, u in updates.items()})


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'hidden_size': 8}} -> {'model.hidden_size': 8}; a mapping below a section's
    key stays that key's value (refused by its type, not read as a deeper key)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and not prefix:
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
    """['train.steps=5', ...] -> {'train.steps': 5}, each value read as YAML; ConfigError
    naming the key for a value that is not YAML (as read_yaml does for a file)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError as e:
            what = " ".join(str(getattr(e, "problem", None) or e).split())
            raise ConfigError(f"override {k.strip()}={v}: cannot parse {v!r} as a YAML "
                              f"value: {what}") from None
    return out


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one mapping (YAML itself would keep the last value)."""

    def __init__(self, key: str, line: int, first: int):
        super().__init__(problem=f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (a section given
    twice, or `steps: 5` then `steps: 7`) instead of silently keeping the last."""

    def construct_mapping(self, node, deep=False):
        paths = self.__dict__.setdefault("_paths", {})       # mapping node -> 'section.'
        prefix = paths.get(id(node), "")
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":      # '<<: *base' may override
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKeyError(f"{prefix}{key}", line, seen[key])
                seen[key] = line
            except TypeError:                    # an unhashable key: SafeLoader reports it
                continue
            if isinstance(value_node, yaml.MappingNode):
                paths[id(value_node)] = f"{prefix}{key}."
        return super().construct_mapping(node, deep)


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
        tree = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKeyError as e:
        raise ConfigError(f"config file {str(path)!r}, line {e.line}: {e.key!r} is given twice "
                          f"(first on line {e.first}); YAML would keep only the last one, so "
                          f"remove or merge one of them") from None
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


def _data_vocab_size(paths) -> int | None:
    """The largest vocabulary of the prepared datasets `paths`; None if there are none or
    one cannot be read (the data checks before training name that one)."""
    from ptdp_jax.data.dataset import TokenDataset
    try:
        return max(TokenDataset(p).vocab_size for p in paths) if paths else None
    except (OSError, ValueError):
        return None


def load_config(config: "str | os.PathLike | Config | None" = None,
                overrides: Mapping[str, Any] | None = None, *, strict: bool = True,
                origin: str = "") -> Config:
    """Defaults, then a YAML file (or a Config), then dotted overrides. A model.vocab_size
    that neither the file nor the overrides set follows data.path's tokenizer (a value
    set too small for the data stays an error, raised when the data is opened). Keys of
    earlier versions: `migrate` (one ConfigWarning, naming `origin` if given); strict=False
    for a saved config."""
    return load_with_keys(config, overrides, strict=strict, origin=origin)[0]


def load_with_keys(config: "str | os.PathLike | Config | None" = None,
                   overrides: Mapping[str, Any] | None = None, *, strict: bool = True,
                   origin: str = "") -> tuple[Config, frozenset[str]]:
    """(load_config's Config, the dotted keys that the file or the overrides set, a null
    (unset) last not counted; every key when `config` is a Config)."""
    overrides, notes = migrate(dict(overrides or {}), strict)
    if isinstance(config, Config):
        warn_old_keys(notes, origin or "the overrides")
        return _apply(config, overrides), frozenset(all_keys())
    cfg, flat = Config(), {}
    if config is not None:
        flat, lines = read_yaml(config)
        where = lambda key: f"config file {str(config)!r}, line {lines.get(key, '?')}: "
        flat, file_notes = migrate(flat, strict, where)
        notes = file_notes + notes
        cfg = _apply(cfg, flat, where)
    warn_old_keys(notes, origin or (f"config file {str(config)!r}" if config is not None
                                    else "the overrides"))
    cfg = _apply(cfg, overrides)
    given = frozenset(k for k, v in {**flat, **overrides}.items() if v is not None)
    if "model.vocab_size" not in given:
        vocab = _data_vocab_size(cfg.data.path)
        if vocab is not None:
            cfg = replace(cfg, model=replace(cfg.model, vocab_size=vocab))
    return cfg, given


def with_absolute_paths(cfg: Config) -> Config:
    """cfg with data.path and data.val_path absolute (relative paths: to the working
    directory), as a run saves it (checkpoint, run.dir), so that the saved config names the
    same files from any directory."""
    absolute = lambda paths: tuple(os.path.abspath(os.path.expanduser(p)) for p in paths)
    data = replace(cfg.data, path=absolute(cfg.data.path), val_path=absolute(cfg.data.val_path))
    return cfg if data == cfg.data else replace(cfg, data=data)


def to_yaml(cfg: Config) -> str:
    """The whole resolved config as YAML (load_config of it gives cfg back)."""
    return yaml.safe_dump(json.loads(json.dumps(cfg.to_dict())), sort_keys=False)
