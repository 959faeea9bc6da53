"""Tokenizers: a dependency-free byte tokenizer and a byte-level BPE.

Both expose the same small interface used by data preparation and by the
trainer's sample printing:

* ``encode(text) -> list[int]`` and ``decode(ids) -> str``
* ``vocab_size`` (number of ids, including the end-of-document token)
* ``eos_id`` (the end-of-document id appended after every document) and ``eos_token``
* ``spec`` (a string that :func:`load_tokenizer` turns back into the tokenizer)

``ByteTokenizer`` maps UTF-8 bytes to ids 0..255 and uses id 256 as ``eos``.
``BPETokenizer`` wraps a HuggingFace ``tokenizers`` tokenizer.json whose
``<|endoftext|>`` special token is the ``eos`` (as in GPT-2), or else the ``eos_token``
of a ``tokenizer_config.json`` beside it (a Hugging Face tokenizer folder: LLaMA's
``</s>``). A folder holding ``tokenizer.json`` names that file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are bytes, id 256 ends a document."""

    vocab_size = 257
    eos_id = 256
    eos_token = EOS_TOKEN
    spec = "byte"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (its UTF-8 bytes); no ``eos`` is appended."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; ids >= 256 (``eos``) are dropped, bad UTF-8 is replaced."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) backed by HuggingFace ``tokenizers``.

    Build one with :meth:`train` or :meth:`from_file`; :meth:`save` writes the
    standard ``tokenizer.json``.  ``spec`` is the path of that file, so a saved
    (or loaded) tokenizer round-trips through :func:`load_tokenizer`.
    """

    def __init__(self, tokenizer, path: str | os.PathLike | None = None,
                 eos_token: str = EOS_TOKEN):
        self._tok = tokenizer
        self.path = None if path is None else Path(path).resolve()
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"BPE tokenizer {path or ''} has no {eos_token!r} special token "
                             f"(the end of a document: {EOS_TOKEN!r}, or the eos_token of a "
                             f"tokenizer_config.json beside it)")
        self.eos_id, self.eos_token = int(eos), eos_token
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))

    @classmethod
    def train(cls, files_or_iterator, vocab_size: int) -> "BPETokenizer":
        """Train a byte-level BPE with ``vocab_size`` ids (including ``eos``).

        ``files_or_iterator`` is either a path / list of paths of text files
        (``Path`` objects, or strings naming existing files) or an iterable of
        document strings.
        """
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < 257:
            raise ValueError(f"BPE vocab_size must be >= 257 (256 bytes + eos), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        files = _as_file_list(files_or_iterator)
        if files is not None:
            for f in files:
                if not os.path.isfile(f):
                    raise FileNotFoundError(f"BPE training file not found: {f}")
            tok.train(files, trainer=trainer)
        else:
            tok.train_from_iterator(iter(files_or_iterator), trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "BPETokenizer":
        """Load a ``tokenizer.json`` written by :meth:`save` (or by HF tokenizers); its eos
        is ``<|endoftext|>``, else the eos_token of a tokenizer_config.json beside it."""
        from tokenizers import Tokenizer

        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:          # the tokenizers library raises a bare Exception
            raise ValueError(f"{path} is not a tokenizer.json that the tokenizers library "
                             f"reads ({' '.join(str(e).split())})") from None
        eos = EOS_TOKEN if tok.token_to_id(EOS_TOKEN) is not None else _config_eos(path)
        return cls(tok, path, eos or EOS_TOKEN)

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` to ``path``; afterwards ``spec`` is that path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(path))
        self.path = path.resolve()
        return self.path

    @property
    def spec(self) -> str:
        if self.path is None:
            raise ValueError("BPETokenizer has no spec until it is saved (call .save(path))")
        return str(self.path)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no ``eos`` is appended."""
        return self._tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of several texts (parallel inside HF tokenizers)."""
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with special tokens (``eos``) skipped."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, path={self.path})"


def _config_eos(path: str | os.PathLike) -> str | None:
    """The eos_token of the tokenizer_config.json beside a tokenizer.json, if any."""
    import json
    conf = Path(path).with_name("tokenizer_config.json")
    try:
        eos = json.loads(conf.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return eos if isinstance(eos, str) else None


def _as_file_list(obj) -> list[str] | None:
    """The file list ``obj`` names, or None when it is an iterable of texts."""
    if isinstance(obj, os.PathLike):
        return [os.fspath(obj)]
    if isinstance(obj, str):
        return [obj] if os.path.isfile(obj) else None
    if isinstance(obj, (list, tuple)) and obj and all(
        isinstance(x, os.PathLike) or (isinstance(x, str) and os.path.isfile(x)) for x in obj
    ):
        return [os.fspath(x) for x in obj]
    return None


def load_tokenizer(spec: str | os.PathLike) -> ByteTokenizer | BPETokenizer:
    """Tokenizer named by ``spec``: ``'byte'``, a path to a ``tokenizer.json``, or a
    folder holding one (a Hugging Face tokenizer folder)."""
    s = os.fspath(spec)
    if s == "byte":
        return ByteTokenizer()
    if os.path.isdir(s):
        if not os.path.isfile(os.path.join(s, "tokenizer.json")):
            raise ValueError(f"tokenizer folder {s!r} holds no tokenizer.json (only the fast "
                             f"tokenizers' tokenizer.json is read)")
        return BPETokenizer.from_file(os.path.join(s, "tokenizer.json"))
    if s.endswith(".json") or os.path.isfile(s):
        return BPETokenizer.from_file(s)
    if s == "bpe":
        raise ValueError("tokenizer 'bpe' must be trained first (give a vocab size) "
                         "or named by the path of its tokenizer.json")
    raise ValueError(f"unknown tokenizer {s!r}: expected 'byte', 'bpe' (ptdp-prepare-data, "
                     f"with --vocab-size), a path to a tokenizer.json or a folder holding one")
