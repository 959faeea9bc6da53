"""The documents of a run's sequences, for the planner to price document-masked attention by
(plan/cost.py `Documents`): the lengths of the documents in each of the stream's first rows,
cut at the row's ends as the layers see them (a document begins just after an end-of-document
token; parallel/context.py `document_starts`)."""
from __future__ import annotations

import numpy as np

SAMPLE_ROWS = 64          # rows of the stream read: enough for the planner's mean, quick to read


def row_documents(tokens_ns, eos: int) -> tuple[tuple[int, ...], ...]:
    """(n, s) input tokens -> each row's document lengths, in order (they sum to s)."""
    tokens = np.asarray(tokens_ns)
    s = tokens.shape[1]
    out = []
    for row in tokens:
        starts = np.flatnonzero(row[:-1] == eos) + 1          # a document after each end
        out.append(tuple(int(x) for x in np.diff(np.concatenate([[0], starts, [s]]))))
    return tuple(out)


def stream_documents(stream, eos: int, rows: int = SAMPLE_ROWS) -> tuple[tuple[int, ...], ...]:
    """row_documents of the first `rows` samples of a data.BlendedStream (their inputs)."""
    n = max(1, min(rows, int(stream.num_samples.sum())))
    return row_documents(stream.get(np.arange(n))[:, :-1], eos)
