"""Data pipeline (pure numpy): tokenizers, token files, blended deterministic sample stream.

Typical use::

    datasets = open_datasets(cfg_paths, cache_dir)          # [] -> default pydoc corpus
    stream = BlendedStream(datasets, weights, seq_len, seed, split="train")
    batch = batch_for_step(stream, step, global_batch_size, rows=slice(lo, hi))
"""

from .corpus import default_corpus_documents, default_corpus_name
from .dataset import (
    BlendedStream,
    TokenDataset,
    batch_for_step,
    blending_indices,
    data_state,
)
from .prepare import (
    prepare_dataset,
    prepare_default_corpus,
    token_dtype,
    write_token_dataset,
)
from .readers import iter_documents
from .sources import check_same_tokenizer, open_datasets, validate_data_config
from .tokenizer import EOS_TOKEN, BPETokenizer, ByteTokenizer, load_tokenizer

__all__ = [
    "EOS_TOKEN",
    "BPETokenizer",
    "BlendedStream",
    "ByteTokenizer",
    "TokenDataset",
    "batch_for_step",
    "blending_indices",
    "check_same_tokenizer",
    "data_state",
    "default_corpus_documents",
    "default_corpus_name",
    "iter_documents",
    "load_tokenizer",
    "open_datasets",
    "prepare_dataset",
    "prepare_default_corpus",
    "token_dtype",
    "validate_data_config",
    "write_token_dataset",
]
