"""The datasets of a run: open ``data.path`` (or build the default corpus), and check
them against each other and the model before anything is read.

This module sits above both :mod:`.dataset` (reading token files) and :mod:`.prepare`
(writing them, and building the default corpus), so neither imports the other back.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from .dataset import TokenDataset, _check_weights
from .prepare import prepare_default_corpus
from .tokenizer import ByteTokenizer


def validate_data_config(paths: list[str] | None, weights: list[float] | None, seq_len: int,
                         val_fraction: float | None = 0.05, key: str = "data.path") -> list[float]:
    """Check ``data.path`` / ``data.weights`` against ``seq_len``; returns normalized weights.

    Empty ``paths`` means the default corpus (then ``weights`` must be empty too).
    ``val_fraction`` None: nothing held out (a validation set of its own); ``key``: the
    config key the paths are (data.val_path too). Raises ``FileNotFoundError`` /
    ``ValueError`` naming the offending key.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if not paths:
        if weights:
            raise ValueError(f"data.weights {list(weights)} given but data.path is empty "
                             "(the default corpus is a single dataset)")
        return [1.0]
    w = _check_weights(weights, len(paths))
    for i, p in enumerate(paths):
        try:
            TokenDataset(p).split_sizes(seq_len, val_fraction)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{key}[{i}] = {str(p)!r}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{key}[{i}] = {str(p)!r}: {e}") from None
    return w.tolist()


def open_datasets(paths: list[str] | None,
                  cache_dir: str | os.PathLike | None = None) -> list[TokenDataset]:
    """Open ``paths``; empty / None means the default ``pydoc`` corpus, built
    once into ``cache_dir`` (default ``~/.cache/ptdp_jax/data``)."""
    if paths:
        return [TokenDataset(p) for p in paths]
    if cache_dir is None:
        cache_dir = Path.home() / ".cache" / "ptdp_jax" / "data"
    return [TokenDataset(prepare_default_corpus(cache_dir))]


def end_of_document(paths) -> int:
    """The token that ends every document of the token files at ``paths`` (one tokenizer:
    check_same_tokenizer): the first one's ``eos_id``; the embedded corpus's byte tokenizer's
    where there are none."""
    if not paths:
        return ByteTokenizer.eos_id
    return _eos_id(str(paths[0]))


@functools.lru_cache(maxsize=None)
def _eos_id(prefix: str) -> int:
    """Once a process: every trace of a step asks (ZeRO's microbatch losses, the stages)."""
    return TokenDataset(prefix).eos_id


def tokenizer_identity(ds: TokenDataset) -> str:
    """What decides a dataset's token ids: 'byte', or the content hash of its
    tokenizer.json (two copies of one tokenizer file are the same tokenizer)."""
    return spec_identity(ds.tokenizer_spec)


PROBE = ("The quick brown fox jumps over the lazy dog. 0123456789 +-*/=<>()[]{} \"'!?;:,\n"
         "def area(r):\n\treturn 3.14159 * r ** 2  # a comment\nÄÖÜ äöü ß é 日本語 🙂")


def same_ids(a: str, b: str) -> bool:
    """Whether tokenizer specs `a` and `b` give text the same ids: the same file (by content),
    or the same vocabulary and the same ids for a probe text (the tokenizer.json exported with
    a byte-tokenizer model acts as 'byte'). True where either cannot be loaded."""
    if spec_identity(a) == spec_identity(b):
        return True
    from .tokenizer import load_tokenizer
    try:
        ta, tb = load_tokenizer(a), load_tokenizer(b)
    except (OSError, ValueError):
        return True
    return ta.vocab_size == tb.vocab_size and list(ta.encode(PROBE)) == list(tb.encode(PROBE))


def spec_identity(spec: str) -> str:
    """tokenizer_identity of a tokenizer spec ('byte' or a tokenizer.json's path)."""
    if spec == "byte":
        return "byte"
    try:
        return "sha256:" + hashlib.sha256(Path(spec).read_bytes()).hexdigest()
    except OSError:
        return "missing:" + spec


def check_same_tokenizer(names: list[str], datasets: list[TokenDataset]) -> None:
    """ValueError naming two datasets whose token ids come from different tokenizers
    (blending them would mix unrelated ids)."""
    ids = [tokenizer_identity(ds) for ds in datasets]
    for i in range(1, len(datasets)):
        if ids[i] != ids[0]:
            raise ValueError(
                f"data.path[0] = {names[0]!r} and data.path[{i}] = {names[i]!r} were made with "
                f"different tokenizers ({datasets[0].tokenizer_spec!r} and "
                f"{datasets[i].tokenizer_spec!r}); datasets blended into one run must share "
                f"one tokenizer (re-run ptdp-prepare-data with the same --tokenizer)")


def check_val_tokenizer(train_name: str, train: TokenDataset, val_paths: list[str],
                        val: list[TokenDataset]) -> None:
    """ValueError naming the first validation dataset (data.val_path) whose token ids come from
    another tokenizer than the training data's (`train`, named `train_name`)."""
    want = tokenizer_identity(train)
    for i, (path, ds) in enumerate(zip(val_paths, val)):
        if tokenizer_identity(ds) != want:
            raise ValueError(
                f"data.val_path[{i}] = {str(path)!r} was made with another tokenizer "
                f"({ds.tokenizer_spec!r}) than the training data {train_name} "
                f"({train.tokenizer_spec!r}): its ids would mean other text to the model "
                f"(re-run ptdp-prepare-data with --tokenizer {train.tokenizer_spec})")


def model_tokenizer(paths, model_vocab_size: int, spec: str | None = None,
                    kept: tuple[str, str] | None = None):
    """(spec, tokenizer) to encode and decode for a model trained on ``paths``: ``spec``
    if given, else the one a checkpoint keeps (``kept``: its spec and the name it had in
    training; ckpt_format.checkpoint_tokenizer), else that of the data. ValueError if it
    has more ids than the model, or (where the checkpoint or the data still tells its
    own) a vocabulary of another size than that one: such a tokenizer would turn the
    model's ids into other text, or drop them."""
    from .tokenizer import load_tokenizer
    if kept is not None:
        data_spec, data_name = kept
        data_tok = load_tokenizer(data_spec)
        data = "the training data, kept in the checkpoint"
    else:
        try:
            data_spec = data_name = tokenizer_spec_of(paths)
            data_tok = load_tokenizer(data_spec)
        except (ValueError, FileNotFoundError):
            if spec is None:
                raise
            data_spec = data_name = data_tok = None
        data = f"data.path[0] = {str(paths[0])!r}" if paths else "the embedded corpus"
    tok = data_tok if spec is None else load_tokenizer(spec)
    if data_tok is not None and tok.vocab_size != data_tok.vocab_size:
        raise ValueError(f"tokenizer {spec!r} has {tok.vocab_size} ids but the model was "
                         f"trained with {data_name!r} ({data_tok.vocab_size} ids, the "
                         f"tokenizer of {data}); drop --tokenizer to use that one")
    if tok.vocab_size > model_vocab_size:
        raise ValueError(f"tokenizer {spec or data_name!r} has {tok.vocab_size} ids but the "
                         f"model's vocabulary is {model_vocab_size}")
    return spec or data_spec, tok


def tokenizer_spec_of(paths) -> str:
    """The tokenizer spec of a run's data (``data.path``; empty: the embedded corpus,
    'byte'). ValueError if the first dataset is gone and nothing else says it."""
    if not paths:
        return "byte"
    try:
        return TokenDataset(paths[0]).tokenizer_spec
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"cannot tell the tokenizer of data.path[0] = {paths[0]!r} ({e}); "
                         f"name it with --tokenizer (byte, or a tokenizer.json)") from None
