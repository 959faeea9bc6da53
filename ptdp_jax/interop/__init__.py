"""Hugging Face interchange: a checkpoint as a transformers directory (export) and back
(hf_import). May import run/ and below."""
