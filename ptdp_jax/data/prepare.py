"""Tokenize text into the on-disk token format read by :mod:`ptdp_jax.data.dataset`.

A prepared dataset ``PREFIX`` is three files (Megatron's indexed dataset, simplified):

* ``PREFIX.bin``     all token ids back to back, an ``eos`` after every document
                     (``uint16`` when ``vocab_size <= 65535``, else ``uint32``)
* ``PREFIX.idx.npy`` ``int64`` document start offsets, length ``num_docs + 1``
* ``PREFIX.json``    metadata: format version, dtype, num_tokens, num_docs,
                     vocab_size, eos_id, tokenizer spec, sources

Inputs: a ``.txt`` file is ONE document, and so is a file of any extension named in
``text_exts`` (``--ext .py,.md``: plain UTF-8 text); a ``.jsonl`` file holds one document
per line in field ``text_key`` (blank lines are skipped); a ``.parquet`` or ``.arrow``
file (Arrow IPC, what Hugging Face ``datasets`` writes) one document a row in column
``text_key`` (read through pyarrow, an optional dependency; null rows are skipped); a
folder, its ``.parquet`` and ``.arrow`` files (``Dataset.save_to_disk``'s folder) and, with
``text_exts``, its files of those extensions at any depth (hidden ones skipped). Large inputs
(or any, on a terminal) show a progress bar on stderr.
Files are written under temporary names and renamed; the metadata is written last, so
a dataset whose ``.json`` exists is complete.

Command line: ``ptdp-prepare-data INPUT [INPUT ...] --out PREFIX
[--tokenizer byte|bpe|PATH.json|HF_DIR] [--vocab-size N] [--text-key text] [--ext .py,.md]
[--overwrite]``
(an existing dataset at PREFIX is refused without ``--overwrite``; PREFIX is a file prefix
such as ``data/mycorpus``: a folder, a path ending in ``/``, ``.`` or ``..`` is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ptdp_jax.command import command
from ptdp_jax.paths import unwritable

from .corpus import default_corpus_documents, default_corpus_name
from .dataset import TokenDataset
from .readers import ARROW_SUFFIXES, STRUCTURED, SUFFIXES, arrow_schema, iter_documents
from .tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer

FORMAT_VERSION = 1
_FLUSH_CHARS = 8 << 20  # tokenize and write after this many buffered characters


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype holding ids < ``vocab_size``."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


LARGE_INPUT_BYTES = 256 << 20                   # a progress bar from this much input on


def parse_exts(text: str | None) -> tuple[str, ...]:
    """'--ext .py,.md' (or 'py,md') as ('.py', '.md'); ValueError for an empty one or one of
    the structured formats (.jsonl, .parquet, .arrow), which are read as records."""
    exts = []
    for item in (text or "").split(","):
        ext = item.strip()
        ext = ext if ext.startswith(".") or not ext else "." + ext
        if ext in ("", ".") or "/" in ext or ext in STRUCTURED:
            raise ValueError(f"--ext {text!r}: {item.strip()!r} is not an extension of plain-text "
                             f"files (give e.g. --ext .py,.md; {', '.join(STRUCTURED)} are read "
                             f"as records, not as text)")
        exts.append(ext)
    return tuple(dict.fromkeys(exts))


def _folder_files(folder: Path, text_exts: tuple[str, ...]) -> list[Path]:
    """A folder's inputs in name order: its .parquet and .arrow files, and its files of
    `text_exts` at any depth (hidden files and folders skipped)."""
    files = [f for f in folder.iterdir() if f.suffix in ARROW_SUFFIXES and f.is_file()]
    if text_exts:
        files += [f for f in folder.rglob("*") if f.suffix in text_exts and f.is_file()
                  and not any(part.startswith(".") for part in f.relative_to(folder).parts)]
    return sorted(set(files))


def check_inputs(inputs: Iterable[str | os.PathLike], text_key: str | None = None,
                 text_exts: tuple[str, ...] = ()) -> list[Path]:
    """Input files, checked: each a ``.txt``, ``.jsonl``, ``.parquet`` or ``.arrow`` file, or
    one of `text_exts` (plain text); a folder stands for _folder_files'. With `text_key`, each
    Parquet/Arrow file must have that column."""
    paths, suffixes = [], SUFFIXES + tuple(e for e in text_exts if e not in SUFFIXES)
    for p in map(Path, inputs):
        if p.is_dir():
            files = _folder_files(p, text_exts)
            if not files:
                what = " or ".join([".parquet or .arrow files"]
                                   + [f"{', '.join(text_exts)} files"] * bool(text_exts))
                raise ValueError(f"{p}: a folder with no {what} (of a DatasetDict saved to "
                                 f"disk, give one split's folder, such as {p / 'train'}; for "
                                 f"text files of other extensions, --ext .py,.md)")
            paths += files
            continue
        if not p.is_file():
            raise FileNotFoundError(f"input file not found: {p}")
        if p.suffix not in suffixes:
            raise ValueError(f"{p}: unsupported input type {p.suffix!r} (expected "
                             f"{', '.join(suffixes)} or a folder of .parquet/.arrow files; "
                             f"--ext {p.suffix or '.EXT'} reads such files as plain text)")
        paths.append(p)
    if not paths:
        raise ValueError("no input files given")
    for p in paths:
        if p.suffix in ARROW_SUFFIXES and text_key is not None:
            names = arrow_schema(p).names
            if text_key not in names:
                raise ValueError(f"{p}: no column {text_key!r} (columns: {', '.join(names)}); "
                                 f"name the text column with --text-key")
    return paths


def _progress_bar(paths: list[Path], what: str):
    """A tqdm bar over the input bytes on stderr where stderr is a terminal or the input is
    at least LARGE_INPUT_BYTES (a log then gets a line every 30 s); None otherwise."""
    total = sum(p.stat().st_size for p in paths)
    terminal = sys.stderr.isatty()
    if not (terminal or total >= LARGE_INPUT_BYTES):
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=what, unit="B", unit_scale=True, file=sys.stderr,
                mininterval=0.5 if terminal else 30.0, dynamic_ncols=terminal)


def _tracked(paths: list[Path], text_key: str, bar) -> Iterator[str]:
    """The documents of `paths`, moving `bar` (input bytes, or None) on the way: by each
    document's length within a file (never past its end), to the file's end after it."""
    done = 0
    for p in paths:
        done += p.stat().st_size
        for doc in iter_documents(p, text_key):
            yield doc
            if bar is not None:
                bar.update(min(len(doc), done - bar.n))
        if bar is not None:
            bar.update(done - bar.n)


def _encode_docs(tok, texts: list[str]) -> list[np.ndarray]:
    if isinstance(tok, ByteTokenizer):  # fast path: the bytes are the ids
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    if hasattr(tok, "encode_batch"):
        return [np.asarray(ids, dtype=np.int64) for ids in tok.encode_batch(texts)]
    return [np.asarray(tok.encode(t), dtype=np.int64) for t in texts]


def write_token_dataset(documents: Iterable[str], out_prefix: str | os.PathLike, tok,
                        tokenizer_spec: str | None = None, sources: list[str] = ()) -> dict:
    """Tokenize ``documents`` (an ``eos`` after each) into ``out_prefix.{bin,idx.npy,json}``.

    Streams: documents are tokenized in chunks and appended to the open ``.bin``.
    Empty documents are skipped.  Returns the metadata dict.
    """
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    final = {s: Path(f"{prefix}{s}") for s in (".bin", ".idx.npy", ".json")}
    tmp = {s: Path(f"{p}.tmp{os.getpid()}") for s, p in final.items()}
    offsets = [0]
    eos = np.array([tok.eos_id], dtype=dtype)

    def flush(buffer: list[str], f) -> None:
        for ids in _encode_docs(tok, buffer):
            f.write(ids.astype(dtype, copy=False).tobytes())
            f.write(eos.tobytes())
            offsets.append(offsets[-1] + len(ids) + 1)
        buffer.clear()

    try:
        with open(tmp[".bin"], "wb") as f:
            buffer, chars = [], 0
            for doc in documents:
                if not doc:
                    continue
                buffer.append(doc)
                chars += len(doc)
                if chars >= _FLUSH_CHARS:
                    flush(buffer, f)
                    chars = 0
            flush(buffer, f)
        if len(offsets) == 1:
            inputs = ", ".join(sources) or "-"
            raise ValueError(f"no documents found for {prefix} (inputs: {inputs})")
        with open(tmp[".idx.npy"], "wb") as f:
            np.save(f, np.asarray(offsets, dtype=np.int64))
        meta = {
            "format": "ptdp_jax.tokens", "version": FORMAT_VERSION, "dtype": dtype.name,
            "num_tokens": offsets[-1], "num_docs": len(offsets) - 1,
            "vocab_size": int(tok.vocab_size), "eos_id": int(tok.eos_id),
            "tokenizer": tokenizer_spec if tokenizer_spec is not None else tok.spec,
            "sources": [str(s) for s in sources],
        }
        tmp[".json"].write_text(json.dumps(meta, indent=2) + "\n")
        final[".json"].unlink(missing_ok=True)  # the old dataset is incomplete from here on
        os.replace(tmp[".bin"], final[".bin"])
        os.replace(tmp[".idx.npy"], final[".idx.npy"])
        os.replace(tmp[".json"], final[".json"])
    finally:
        for p in tmp.values():
            p.unlink(missing_ok=True)
    return meta


def check_out_prefix(out_prefix: str | os.PathLike) -> Path:
    """``out_prefix`` as a Path, or a ValueError where it names a folder rather than a file
    prefix: an existing folder, a path ending in a separator, ``.``, ``..`` or nothing."""
    text = os.fspath(out_prefix)
    seps = "".join(s for s in (os.sep, os.altsep) if s)
    if text and not text.endswith(tuple(seps)) and os.path.basename(text) not in (".", "..") \
            and not Path(text).is_dir():
        return Path(text)
    where = text.rstrip(seps) or text[:1] or "."
    raise ValueError(f"--out {text!r} is {'a folder' if text else 'empty'}; --out is a file "
                     f"prefix: e.g. --out {os.path.join(where, 'mycorpus')} writes "
                     f"mycorpus.bin, mycorpus.idx.npy and mycorpus.json in {where}")


def prepare_dataset(inputs: list[str], out_prefix: str | os.PathLike, tokenizer: str = "byte",
                    text_key: str = "text", bpe_vocab_size: int | None = None,
                    overwrite: bool = False, text_exts: tuple[str, ...] = ()) -> Path:
    """Tokenize ``inputs`` (.txt, .jsonl, .parquet, .arrow files, folders of the last two;
    files of ``text_exts`` as plain text, also in folders) into the dataset ``out_prefix``.

    ``tokenizer`` is ``'byte'``, a path to a ``tokenizer.json`` (or a Hugging Face
    tokenizer folder holding one), or ``'bpe'``
    together with ``bpe_vocab_size``: then a byte-level BPE is trained on the
    inputs and saved as ``out_prefix.tokenizer.json`` (recorded in the metadata
    relative to the dataset's folder).  Returns ``out_prefix`` as a Path.
    An existing dataset at ``out_prefix`` is a FileExistsError unless ``overwrite``; a
    folder as ``out_prefix``, or one whose folder cannot take files, is a ValueError
    (check_out_prefix, paths.unwritable), before anything is read.
    """
    prefix = check_out_prefix(out_prefix)
    paths = check_inputs(inputs, text_key, tuple(text_exts))
    ours = (".bin", ".idx.npy", ".json") + ((".tokenizer.json",) if tokenizer == "bpe" else ())
    old = [f"{prefix}{s}" for s in ours if os.path.exists(f"{prefix}{s}")]
    if old and not overwrite:
        raise FileExistsError(f"--out {str(prefix)!r}: a dataset is already there "
                              f"({', '.join(old)}); give --overwrite to replace it, or "
                              f"another prefix")
    why = unwritable(prefix.parent)             # last: its probe file touches the folder
    if why:
        raise ValueError(f"--out {os.fspath(out_prefix)!r}: {prefix.parent} {why}")

    def documents(what: str) -> Iterator[str]:
        bar = _progress_bar(paths, what)
        try:
            yield from _tracked(paths, text_key, bar)
        finally:
            if bar is not None:
                bar.close()

    if tokenizer == "bpe":
        if bpe_vocab_size is None:
            raise ValueError("tokenizer 'bpe' needs a vocab size (--vocab-size / bpe_vocab_size)")
        tok = BPETokenizer.train(documents("training the BPE"), bpe_vocab_size)
        tok_path = Path(f"{prefix}.tokenizer.json")
        tmp_path = Path(f"{tok_path}.tmp{os.getpid()}.json")
        tok.save(tmp_path)
        os.replace(tmp_path, tok_path)
        tok.path = tok_path.resolve()
        spec = tok_path.name  # relative to the dataset's folder: survives moving the folder
    else:
        if bpe_vocab_size is not None:
            raise ValueError(f"a BPE vocab size only applies to tokenizer 'bpe', not {tokenizer!r}")
        tok = load_tokenizer(tokenizer)
        spec = tok.spec
    write_token_dataset(documents("tokenizing"), prefix, tok, spec,
                        sources=[str(p.resolve()) for p in paths])
    return prefix


def prepare_default_corpus(cache_dir: str | os.PathLike) -> Path:
    """Build (once) the byte-tokenized ``pydoc`` corpus in ``cache_dir``; returns its prefix.

    An existing complete copy (metadata present and consistent with ``.bin``)
    is reused.
    """
    prefix = Path(cache_dir) / f"{default_corpus_name()}_byte"
    try:
        TokenDataset(prefix)
        return prefix
    except (FileNotFoundError, ValueError):
        pass
    why = unwritable(prefix.parent)
    if why:
        raise ValueError(f"the embedded corpus (data.path empty) is built once in "
                         f"$PTDP_CACHE_DIR (default ~/.cache/ptdp_jax), but {prefix.parent} "
                         f"{why}: set PTDP_CACHE_DIR to a folder that can be written, or give "
                         f"data.path")
    write_token_dataset(default_corpus_documents(), prefix, ByteTokenizer(),
                        sources=["pydoc_data.topics"])
    return prefix


def _count(n: int, word: str) -> str:
    """'1 document', '2 documents'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


@command("ptdp-prepare-data")
def main(argv: list[str] | None = None) -> int:
    """``ptdp-prepare-data``: tokenize text files into a token dataset."""
    parser = argparse.ArgumentParser(
        prog="ptdp-prepare-data",
        description="Tokenize .txt (one document per file), .jsonl (one document per line) "
                    "and .parquet / .arrow files (one document per row; Hugging Face datasets' "
                    "files, read with pyarrow) into PREFIX.bin / PREFIX.idx.npy / PREFIX.json; "
                    "text files of other extensions with --ext. Large inputs show a progress "
                    "bar on stderr.")
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help=".txt, .jsonl, .parquet or .arrow files, files of --ext, or "
                             "folders of .parquet/.arrow files (and of --ext files)")
    parser.add_argument("--out", required=True, metavar="PREFIX",
                        help="the dataset's file prefix, not a folder: e.g. data/mycorpus "
                             "writes data/mycorpus.bin, .idx.npy and .json")
    parser.add_argument("--tokenizer", default="byte",
                        help="'byte' (default), 'bpe' (train one; needs --vocab-size), "
                             "the path of a tokenizer.json, or a Hugging Face tokenizer folder "
                             "(holding tokenizer.json)")
    parser.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size")
    parser.add_argument("--text-key", default="text",
                        help="the JSONL field or Parquet/Arrow column holding the text")
    parser.add_argument("--ext", metavar=".EXT,...",
                        help="more extensions of plain-text files, comma-separated (e.g. "
                             ".py,.md): each such file is one document, like a .txt, and a "
                             "folder given stands for its files of these extensions too (at "
                             "any depth, hidden ones skipped)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a dataset already at PREFIX (refused otherwise)")
    args = parser.parse_args(argv)
    try:
        exts = parse_exts(args.ext) if args.ext is not None else ()
        prefix = prepare_dataset(args.inputs, args.out, args.tokenizer, args.text_key,
                                 args.vocab_size, overwrite=args.overwrite, text_exts=exts)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        parser.exit(2, f"ptdp-prepare-data: error: {e}\n")
    ds = TokenDataset(prefix)
    files = [f"{prefix}{s}" for s in (".bin", ".idx.npy", ".json")]
    if args.tokenizer == "bpe":
        files.append(f"{prefix}.tokenizer.json")
    print(f"prepared {_count(ds.num_docs, 'document')}, {_count(ds.num_tokens, 'token')} "
          f"(vocab {ds.vocab_size}, {ds.dtype.name}) -> {', '.join(files)}")
    if args.tokenizer == "bpe" and args.vocab_size and ds.vocab_size < args.vocab_size:
        print(f"note: the BPE stopped at {ds.vocab_size} of the {args.vocab_size} ids asked for: "
              f"the text holds no more merges (more text gives a larger vocabulary)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
