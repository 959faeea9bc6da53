"""The data of a run as sharded global batches: `Feed(cfg).batch(step)`.

Opens ``data.path`` (or the embedded corpus) and ``data.val_path``, checks them against the
model (vocabulary, sequence length, one tokenizer for every dataset) and raises ConfigError
naming the key otherwise; then hands out the global batch of a step as one array sharded over
'data', each process reading from disk only the rows of its own devices.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.config import decisions as D
from ptdp_jax.config.load import Config, ConfigError
from ptdp_jax.data import (BlendedStream, batch_for_step, check_same_tokenizer, open_datasets,
                           validate_data_config)
from ptdp_jax.data.sources import check_val_tokenizer


def open_streams(cfg: Config, train: bool = True):
    """(datasets, train stream, validation stream); ConfigError for data that cannot
    serve this model. The validation stream is data.val_path's every window where it is
    given (data.path keeps all of its own for training), else data.path's last
    data.val_fraction. train=False (evaluation alone) with data.val_path: data.path is not
    opened (datasets are the validation sets, no train stream)."""
    paths, val_paths = list(cfg.data.path), list(cfg.data.val_path)
    held_out = None if val_paths else cfg.data.val_fraction
    s = cfg.model.seq_len
    try:
        if val_paths and not train:
            val_sets = _open_val(cfg, val_paths)
            return val_sets, None, BlendedStream(val_sets, validate_data_config(
                val_paths, None, s, None, key="data.val_path"), s, cfg.train.seed,
                split="val", val_fraction=None)
        weights = validate_data_config(paths, list(cfg.data.weights) or None, s, held_out)
        datasets = open_datasets(paths, D.cache_dir())
        names = paths or ["<embedded corpus>"]
        check_same_tokenizer(names, datasets)
        _check_fit(cfg, names, datasets, 1 if val_paths else 2)
        _check_documents(cfg, names, datasets)
        mk = lambda sets, w, split: BlendedStream(sets, w, s, cfg.train.seed, split=split,
                                                  val_fraction=held_out)
        if not val_paths:
            return datasets, mk(datasets, weights, "train"), mk(datasets, weights, "val")
        val_weights = validate_data_config(val_paths, None, s, None, key="data.val_path")
        val_sets = _open_val(cfg, val_paths)
        check_val_tokenizer(repr(names[0]), datasets[0], val_paths, val_sets)
        return datasets, mk(datasets, weights, "train"), mk(val_sets, val_weights, "val")
    except (ValueError, FileNotFoundError) as e:
        msg = str(e)
        if "seq_len" in msg and "model.seq_len" not in msg:
            msg += f" (model.seq_len={s})"
        raise ConfigError(msg) from None


def _open_val(cfg: Config, val_paths):
    val_sets = open_datasets(val_paths)
    _check_fit(cfg, [f"data.val_path[{i}] = {p!r}" for i, p in enumerate(val_paths)],
               val_sets, 1)
    return val_sets


def _check_fit(cfg: Config, names, datasets, windows: int) -> None:
    """ValueError for a dataset whose vocabulary the model lacks, or with fewer than
    `windows` sequences of model.seq_len (2: one to train on, one to validate on)."""
    s = cfg.model.seq_len
    for name, ds in zip(names, datasets):
        shown = name if name.startswith("data.") else f"data.path {name!r}"
        if ds.vocab_size > cfg.model.vocab_size:
            raise ValueError(f"{shown} has vocabulary {ds.vocab_size} but "
                             f"model.vocab_size={cfg.model.vocab_size} is smaller")
        if ds.num_windows(s) < windows:
            why = ("fewer than two sequences of model.seq_len={s} (one to train on, one to "
                   "validate on; it needs at least {n} tokens)" if windows == 2 else
                   "not one sequence of model.seq_len={s} (it needs at least {n} tokens)")
            raise ValueError(f"{shown} has {ds.num_tokens} tokens: "
                             + why.format(s=s, n=windows * s + 1))


def _check_documents(cfg: Config, names, datasets) -> None:
    """data.document_mask needs documents to mask between: ValueError where every dataset is
    one document (no end-of-document token inside it)."""
    if cfg.data.document_mask and all(ds.num_docs <= 1 for ds in datasets):
        shown = ", ".join(repr(n) for n in names)
        raise ValueError(f"data.document_mask=true, but data.path {shown} holds one document "
                         f"(no end-of-document token inside it), so there is nothing to mask "
                         f"between; prepare the data with one document a .txt file or a "
                         f".jsonl line (ptdp-prepare-data), or leave data.document_mask off")


def global_batch(stream, step: int, cfg: Config, sharding: NamedSharding):
    """The global batch of `step` as a sharded array; each device's rows are read
    from disk by the process that owns it (so a host reads only its own part)."""
    B, s = cfg.train.global_batch_size, cfg.model.seq_len
    cache: dict[tuple[int, int], np.ndarray] = {}       # devices holding the same rows: one read

    def rows(index):
        sl = index[0]
        key = (sl.start or 0, sl.stop or B)
        if key not in cache:
            cache[key] = batch_for_step(stream, step, B, rows=slice(*key))
        return cache[key]

    return jax.make_array_from_callback((B, s + 1), sharding, rows)


class Feed:
    """Train and validation batches of a run (see the module doc)."""

    def __init__(self, cfg: Config, mesh=None, train: bool = True):
        self.cfg = cfg
        self.datasets, self.train_stream, self.val_stream = open_streams(cfg, train)
        self.sharding = None if mesh is None else NamedSharding(mesh, P("data"))

    def use_mesh(self, mesh) -> "Feed":
        self.sharding = NamedSharding(mesh, P("data"))
        return self

    def batch(self, step: int):
        """The training batch of `step` (a pure function of seed and step)."""
        return global_batch(self.train_stream, step, self.cfg, self.sharding)

    def val_batch(self, i: int):
        """The i-th validation batch (the same ones at every evaluation)."""
        return global_batch(self.val_stream, i, self.cfg, self.sharding)

    @property
    def tokenizer_spec(self) -> str:
        return self.datasets[0].tokenizer_spec
