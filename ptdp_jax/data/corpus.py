"""The default training corpus: Python's own documentation.

Every CPython installation ships the text of the language reference topics
used by ``help()`` in :mod:`pydoc_data.topics`.  It is a few hundred kilobytes
of real English/technical prose, available offline on any fresh machine, which
makes it a convenient default corpus for smoke tests and small training runs.

The text differs between Python versions; :func:`default_corpus_name` includes
the version so caches built by different interpreters never mix.
"""

from __future__ import annotations

import sys


def default_corpus_documents() -> list[str]:
    """One document per ``pydoc`` topic, sorted by topic name (deterministic)."""
    from pydoc_data.topics import topics

    docs = [topics[key] for key in sorted(topics)]
    return [d for d in docs if d.strip()]


def default_corpus_name() -> str:
    """Cache name of the default corpus for this interpreter, e.g. ``pydoc_topics_py3.11``."""
    return f"pydoc_topics_py{sys.version_info.major}.{sys.version_info.minor}"
