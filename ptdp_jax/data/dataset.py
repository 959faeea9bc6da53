"""Token datasets, blending and the deterministic sample stream.

* :class:`TokenDataset` memory-maps a prepared ``PREFIX.bin`` (never read whole).
  Its samples ("windows") are ``seq_len + 1`` tokens starting at multiples of
  ``seq_len``: window ``i`` is ``tokens[i*s : i*s + s + 1]`` (inputs are the
  first ``s``, labels the last ``s``); document boundaries are ignored, an
  ``eos`` token separates documents.  The LAST ``val_fraction`` of the windows
  (at least one) is held out for validation, the rest is for training; without a
  ``val_fraction`` (None: a separate validation set, ``data.val_path``) a stream of
  either split takes every window.
* :class:`BlendedStream` is an infinite, deterministic stream over several
  datasets.  Global sample ``g`` goes to dataset ``k`` by Megatron's blending
  rule (pick the dataset whose count is furthest below ``weight_k * (g + 1)``),
  so every prefix of the stream holds each dataset's share to within one sample.
  Within a dataset, samples follow a fresh permutation per epoch seeded by
  ``(seed, split, dataset index, epoch)``.
* :func:`batch_for_step`: the global batch of step ``t`` is samples
  ``[t*B, (t+1)*B)``; a data-parallel rank reads only its rows.  A batch is a pure
  function of (stream config, step), so the "position in the data stream" of a
  run is just its step (``consumed_samples = step * B``): resuming and changing
  the parallel layout both reproduce exactly the same data.
"""

from __future__ import annotations

import json
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np

_MAX_PERIOD = 1 << 16  # longest blending period (weights quantized to 1/65536 if need be)
_PERM_CACHE = 8  # permutations kept per stream


def _as_prefix(path: str | os.PathLike) -> Path:
    """``PREFIX`` for ``PREFIX``, ``PREFIX.bin``, ``PREFIX.idx.npy`` or ``PREFIX.json``."""
    s = os.fspath(path)
    for suffix in (".idx.npy", ".bin", ".json"):
        if s.endswith(suffix) and not s.endswith(".tokenizer.json"):
            return Path(s[: -len(suffix)])
    return Path(s)


class TokenDataset:
    """A prepared token file: ``PREFIX.bin`` (memory-mapped) plus ``PREFIX.json`` metadata."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = _as_prefix(prefix)
        meta_path, bin_path = Path(f"{self.prefix}.json"), Path(f"{self.prefix}.bin")
        for p in (meta_path, bin_path):
            if not p.is_file():
                raise FileNotFoundError(f"token dataset {str(self.prefix)!r}: {p} not found "
                                        "(create it with ptdp-prepare-data)")
        try:
            self.metadata = meta = json.loads(meta_path.read_text())
            self.dtype = np.dtype(meta["dtype"])
            self.num_tokens, self.num_docs = int(meta["num_tokens"]), int(meta["num_docs"])
            self.vocab_size, self.eos_id = int(meta["vocab_size"]), int(meta["eos_id"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{meta_path}: bad token dataset metadata ({e!r})") from None
        size = bin_path.stat().st_size
        if size != self.num_tokens * self.dtype.itemsize or self.num_tokens < 1:
            raise ValueError(f"{bin_path}: {size} bytes but metadata says {self.num_tokens} "
                             f"{self.dtype.name} tokens (incomplete? re-run ptdp-prepare-data)")
        self.tokens = np.memmap(bin_path, dtype=self.dtype, mode="r", shape=(self.num_tokens,))
        self._offsets = None

    @property
    def doc_offsets(self) -> np.ndarray:
        """``int64`` document start offsets (length ``num_docs + 1``), memory-mapped."""
        if self._offsets is None:
            path = Path(f"{self.prefix}.idx.npy")
            offsets = np.load(path, mmap_mode="r")
            if offsets.shape != (self.num_docs + 1,) or int(offsets[-1]) != self.num_tokens:
                raise ValueError(f"{path}: document index does not match {self.prefix}.json")
            self._offsets = offsets
        return self._offsets

    @property
    def tokenizer_spec(self) -> str:
        """Spec for :func:`load_tokenizer`; relative tokenizer paths are resolved
        against the dataset's folder."""
        spec = str(self.metadata["tokenizer"])
        if spec != "byte" and not os.path.isabs(spec):
            spec = str((self.prefix.parent / spec).resolve())
        return spec

    def num_windows(self, seq_len: int) -> int:
        """Number of whole ``seq_len + 1`` windows (stride ``seq_len``)."""
        return max(0, (self.num_tokens - 1) // seq_len)

    def split_sizes(self, seq_len: int, val_fraction: float | None = 0.05) -> tuple[int, int]:
        """``(num_train, num_val)`` windows; validation is the last ``val_fraction``
        (None: none held out, ``(num_windows, 0)``; at least one window)."""
        n = self.num_windows(seq_len)
        if val_fraction is None:
            if n < 1:
                raise ValueError(f"token dataset {str(self.prefix)!r} has {self.num_tokens} "
                                 f"tokens: too few for 1 sample of seq_len {seq_len} "
                                 f"(needs >= {seq_len + 1})")
            return n, 0
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if n < 2:
            raise ValueError(f"token dataset {str(self.prefix)!r} has {self.num_tokens} tokens: "
                             f"too few for 2 samples of seq_len {seq_len} "
                             f"(needs >= {2 * seq_len + 1})")
        n_val = min(n - 1, max(1, int(n * val_fraction)))
        return n - n_val, n_val

    def read_windows(self, window_ids: np.ndarray, seq_len: int) -> np.ndarray:
        """Windows ``window_ids`` as an ``int32`` array of shape ``(len, seq_len + 1)``."""
        w = np.asarray(window_ids, dtype=np.int64)
        if w.size and (w.min() < 0 or w.max() >= self.num_windows(seq_len)):
            raise IndexError(f"window id out of range for {self.prefix} at seq_len {seq_len}")
        pos = w[:, None] * seq_len + np.arange(seq_len + 1, dtype=np.int64)
        return np.asarray(self.tokens[pos], dtype=np.int32)

    def __repr__(self) -> str:
        return (f"TokenDataset({str(self.prefix)!r}, tokens={self.num_tokens}, "
                f"docs={self.num_docs}, vocab={self.vocab_size})")


def _integer_weights(weights: np.ndarray) -> list[int]:
    """Weights as small integers ``m_k`` with the same ratios (exact when the
    normalized weights are fractions with denominators <= 1000, else quantized
    to 1/65536)."""
    p = weights / weights.sum()
    fr = [Fraction(float(x)).limit_denominator(1000) for x in p]
    period = math.lcm(*(f.denominator for f in fr))
    close = all(abs(float(f) - x) < 1e-9 for f, x in zip(fr, p))
    if sum(fr) == 1 and period <= _MAX_PERIOD and close:
        return [f.numerator * (period // f.denominator) for f in fr]
    raw = p * _MAX_PERIOD  # largest remainder apportionment
    m = np.floor(raw).astype(np.int64)
    m[np.argsort(m - raw, kind="stable")[: _MAX_PERIOD - int(m.sum())]] += 1
    return [int(x) for x in m // np.gcd.reduce(m)]


def blending_indices(int_weights: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """One period (``D = sum(int_weights)`` samples) of Megatron's greedy blending.

    Sample ``g`` goes to the dataset with the largest error ``w_k (g+1) - count_k``
    (ties: lowest index); the arithmetic is exact in integers (errors scaled by
    ``D``).  Errors stay > -1 and sum to 0 after each pick, and at ``g + 1 = D``
    they are integers, hence all 0: the sequence is periodic with period ``D``.
    Returns ``(dataset_index, index_within_dataset)`` for ``g`` in ``[0, D)``.
    """
    m, period, num = list(int_weights), sum(int_weights), len(int_weights)
    counts = [0] * num
    dataset_index = np.empty(period, dtype=np.int32)
    sample_index = np.empty(period, dtype=np.int64)
    for g in range(period):
        t = g + 1
        k = max(range(num), key=lambda i: m[i] * t - period * counts[i])
        dataset_index[g], sample_index[g] = k, counts[k]
        counts[k] += 1
    assert counts == m, "blending period did not close"
    return dataset_index, sample_index


def _check_weights(weights, num_paths: int) -> np.ndarray:
    w = np.ones(num_paths) if weights is None or len(weights) == 0 else np.asarray(weights, float)
    if w.shape != (num_paths,):
        raise ValueError(f"data.weights has {len(w)} entries but data.path has {num_paths}")
    for i, x in enumerate(w):
        if not (np.isfinite(x) and x >= 0):
            raise ValueError(f"data.weights[{i}] = {x} must be finite and >= 0")
    if w.sum() <= 0:
        raise ValueError(f"data.weights are all zero: {w.tolist()}")
    return w / w.sum()


class BlendedStream:
    """Deterministic infinite sample stream blended from ``datasets``.

    ``get(g)`` returns samples for global indices ``g`` (any order, any subset):
    the result depends only on the datasets, weights, seq_len, seed, split and
    ``val_fraction`` -- never on which samples were read before. ``val_fraction=None``:
    every window of each dataset, whichever the split (a validation set of its own).
    """

    def __init__(self, datasets: list[TokenDataset], weights: list[float] | None, seq_len: int,
                 seed: int, split: str = "train", val_fraction: float | None = 0.05):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if not datasets:
            raise ValueError("BlendedStream needs at least one dataset")
        if int(seed) < 0 or int(seq_len) < 1:
            raise ValueError(f"need seed >= 0 and seq_len >= 1, got seed={seed} seq_len={seq_len}")
        self.datasets, self.split = list(datasets), split
        self.seq_len, self.seed = int(seq_len), int(seed)
        self.weights = _check_weights(weights, len(self.datasets))
        sizes = [ds.split_sizes(self.seq_len, val_fraction) for ds in self.datasets]
        held_out = split == "val" and val_fraction is not None
        self.num_samples = np.array([n_val if held_out else n_tr for n_tr, n_val in sizes])
        self._base = np.array([n_tr if held_out else 0 for n_tr, _ in sizes])
        self._int_weights = np.array(_integer_weights(self.weights), dtype=np.int64)
        self._choice, self._within = blending_indices(self._int_weights.tolist())
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def _permutation(self, k: int, epoch: int) -> np.ndarray:
        key = (k, epoch)
        if key not in self._perms:
            if len(self._perms) >= _PERM_CACHE:
                self._perms.pop(next(iter(self._perms)))
            split_id = 0 if self.split == "train" else 1
            rng = np.random.default_rng([self.seed, split_id, k, epoch])
            self._perms[key] = rng.permutation(int(self.num_samples[k]))
        return self._perms[key]

    def locate(self, global_indices) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset_ids, window_ids)`` of global sample indices (window ids index
        the dataset's windows; validation windows follow the training ones)."""
        g = np.asarray(global_indices, dtype=np.int64).reshape(-1)
        if g.size and g.min() < 0:
            raise IndexError("global sample indices must be >= 0")
        cycle, r = np.divmod(g, len(self._choice))
        k = self._choice[r].astype(np.int64)
        j = cycle * self._int_weights[k] + self._within[r]  # j-th sample drawn from dataset k
        windows = np.empty_like(g)
        for kk in np.unique(k):
            sel = k == kk
            epoch, pos = np.divmod(j[sel], self.num_samples[kk])
            out = np.empty_like(pos)
            for e in np.unique(epoch):
                in_e = epoch == e
                out[in_e] = self._permutation(int(kk), int(e))[pos[in_e]]
            windows[sel] = self._base[kk] + out
        return k, windows

    def get(self, global_indices) -> np.ndarray:
        """Samples as ``int32`` of shape ``(len(global_indices), seq_len + 1)``."""
        k, windows = self.locate(global_indices)
        out = np.empty((len(k), self.seq_len + 1), dtype=np.int32)
        for kk in np.unique(k):
            sel = k == kk
            out[sel] = self.datasets[kk].read_windows(windows[sel], self.seq_len)
        return out


def batch_for_step(stream: BlendedStream, step: int, global_batch_size: int,
                   rows: slice | None = None) -> np.ndarray:
    """Global batch of ``step`` (samples ``[step*B, (step+1)*B)``), or only its ``rows``.

    Only the selected rows are read from disk, so each data-parallel rank can
    load its own shard.  Returns ``int32`` of shape ``(rows, seq_len + 1)``.
    """
    if step < 0 or global_batch_size < 1:
        raise ValueError(f"need step >= 0 and global_batch_size >= 1, "
                         f"got {step}, {global_batch_size}")
    g = np.arange(step * global_batch_size, (step + 1) * global_batch_size, dtype=np.int64)
    return stream.get(g if rows is None else g[rows])


def data_state(step: int, global_batch_size: int) -> dict:
    """Position in the data stream after ``step`` optimizer steps (for checkpoints)."""
    return {"step": int(step), "global_batch_size": int(global_batch_size),
            "consumed_samples": int(step) * int(global_batch_size)}
