"""Documents from input files: a plain-text file is one document, a ``.jsonl`` file one a line
(field ``text_key``), a ``.parquet`` or ``.arrow`` file one a row (column ``text_key``, read
through pyarrow, an optional dependency); text that is not UTF-8 is a ValueError naming the
file and the byte offset."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

SUFFIXES = (".txt", ".jsonl", ".parquet", ".arrow")
ARROW_SUFFIXES = (".parquet", ".arrow")
STRUCTURED = (".jsonl",) + ARROW_SUFFIXES       # not plain text: never an --ext


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ValueError("reading .parquet and .arrow files needs the pyarrow package: "
                         "pip install pyarrow") from None
    return pyarrow


def arrow_schema(path: Path):
    pa = _pyarrow()
    try:
        if path.suffix == ".parquet":
            return pa.parquet.read_schema(path)
        with pa.memory_map(str(path)) as source:
            try:
                return pa.ipc.open_stream(source).schema
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_file(source).schema
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path}: cannot read it as {path.suffix[1:]}: {e}") from None


def _arrow_batches(path: Path):
    """The record batches of a .parquet file or an Arrow IPC file (stream or file format)."""
    pa = _pyarrow()
    if path.suffix == ".parquet":
        yield from pa.parquet.ParquetFile(path).iter_batches(batch_size=1024)
        return
    with pa.memory_map(str(path)) as source:
        try:
            yield from pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _arrow_documents(path: Path, text_key: str) -> Iterator[str]:
    pa = _pyarrow()
    try:
        for batch in _arrow_batches(path):
            names = batch.schema.names
            if text_key not in names:
                raise ValueError(f"{path}: no column {text_key!r} (columns: "
                                 f"{', '.join(names)}); name the text column with --text-key")
            column = batch.column(names.index(text_key))
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise ValueError(f"{path}: column {text_key!r} is {column.type}, not text")
            yield from (t for t in column.to_pylist() if t is not None)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path}: cannot read it as {path.suffix[1:]}: {e}") from None


def iter_documents(path: str | os.PathLike, text_key: str = "text") -> Iterator[str]:
    """Documents of one input file (``.jsonl``: one per line; ``.parquet`` / ``.arrow``: one
    per row of column ``text_key``; any other, ``.txt`` or an ``--ext``: the whole file)."""
    path = Path(path)
    if path.suffix not in STRUCTURED:
        yield _read_text(path)
        return
    if path.suffix in ARROW_SUFFIXES:
        yield from _arrow_documents(path, text_key)
        return
    yield from _jsonl_documents(path, text_key)


def _utf8(data: bytes, path: Path, offset: int = 0, lineno: int | None = None) -> str:
    """`data` (read from `path` at byte `offset`) as UTF-8 text; a ValueError naming the file,
    the byte offset in it (and the line) where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = f"line {lineno}, " if lineno is not None else ""
        raise ValueError(f"{path}: not UTF-8 text ({line}byte offset {offset + e.start}: "
                         f"0x{data[e.start]:02x}); convert it to UTF-8 first (e.g. iconv -f "
                         f"latin1 -t utf-8)") from None


def _jsonl_documents(path: Path, text_key: str) -> Iterator[str]:
    """The field `text_key` of each non-blank line of a JSONL file."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = _utf8(raw, path, offset, lineno)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(record, dict) or text_key not in record:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with key {text_key!r}")
            if not isinstance(record[text_key], str):
                raise ValueError(f"{path}:{lineno}: field {text_key!r} is not a string")
            yield record[text_key]


def _read_text(path: Path) -> str:
    """A plain-text input whole, newlines as a text-mode read gives them; ValueError naming it
    (and the byte offset) where it is not UTF-8."""
    text = _utf8(path.read_bytes(), path)
    return text.replace("\r\n", "\n").replace("\r", "\n")
