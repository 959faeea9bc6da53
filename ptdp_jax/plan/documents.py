"""What document masking leaves of causal attention, from the data's documents (the planner's
input where data.document_mask is on: data/documents.py reads them). cuDNN's packed layout
(parallel/packed.py) runs a document's own (query, key) pairs, and loops over calls of two
documents of each row, each call a few passes over the device's queries and keys; under
context parallelism a rank runs its two chunks (i and 2c-1-i) apart, each its own
documents' calls plus one for the document begun before the chunk.

    docs = Documents(((2048, 30720), (32768,)))     # each row's document lengths
    docs.share(b, c), docs.calls(b, c), docs.length()
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Documents:
    """Each sampled row's document lengths, in order (every row sums to the sequence)."""
    rows: tuple[tuple[int, ...], ...]

    def share(self, b: int, c: int = 1) -> float:
        """The busiest context rank's (query, key) pairs inside documents, over its causal
        pairs, for microbatches of b rows (their mean)."""
        return _per_microbatch(self.rows, b, c)[0]

    def calls(self, b: int, c: int = 1) -> float:
        """The packed kernel's calls a layer, each over the device's tokens (a chunk's call
        counts half), the busiest rank's, for microbatches of b rows (their mean)."""
        return _per_microbatch(self.rows, b, c)[1]

    def length(self) -> float:
        """The documents' length weighted by their work (sum l^2 / sum l): the length the
        kernel's efficiency is read at."""
        ls = np.concatenate([np.asarray(r, np.float64) for r in self.rows])
        return float((ls ** 2).sum() / ls.sum())


def _chunks(row: tuple[int, ...], c: int):
    """One row over 2c chunks: (pairs inside documents, documents present, whether the chunk
    begins inside a document begun before it) for each chunk."""
    s = sum(row)
    begins = np.concatenate([[0], np.cumsum(row)[:-1]]).astype(np.int64)
    start = np.repeat(begins, row)                                      # each token's document
    seen = np.arange(s) - start + 1
    L = s // (2 * c)
    at = np.arange(2 * c) * L
    pairs = seen[: 2 * c * L].reshape(2 * c, L).sum(axis=1)
    first = np.searchsorted(begins, at, side="right") - 1               # a chunk's first doc
    last = np.searchsorted(begins, at + L - 1, side="right") - 1
    return pairs, last - first + 1, begins[first] < at


@functools.lru_cache(maxsize=256)
def _per_microbatch(rows, b: int, c: int) -> tuple[float, float]:
    """(share, calls) of `Documents`, the means over the sampled rows' microbatches of b."""
    per_row = [_chunks(r, c) for r in rows]
    s = sum(rows[0])
    causal = s * (s + 1) / 2 / c                                        # a rank's, balanced
    shares, calls = [], []
    for i in range(0, max(1, len(rows) - b + 1), b):
        group = per_row[i:i + b]
        pairs = sum(g[0] for g in group)
        docs = np.max([g[1] for g in group], axis=0)                    # the loop's count
        earlier = np.any([g[2] for g in group], axis=0)
        rank_pairs = [pairs[r] + pairs[2 * c - 1 - r] for r in range(c)]
        shares.append(max(rank_pairs) / (len(group) * causal))
        if c == 1:                                  # the whole row's documents, two a call
            calls.append(-(-max(len(r) for r in rows[i:i + b]) // 2))
            continue
        per_chunk = -(-docs // 2) + earlier
        calls.append(max(per_chunk[r] + per_chunk[2 * c - 1 - r] for r in range(c)) / 2)
    return float(np.mean(shares)), float(np.mean(calls))


def attention_share(documents) -> float:
    """The share of the causal pairs document masking leaves (MFU's attention FLOPs:
    metrics.model_flops_per_iteration); 1 without documents."""
    return documents.share(1) if documents is not None else 1.0
