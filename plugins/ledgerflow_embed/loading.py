"""Saying that an embedding model is loading: one line on stderr before, one after.

A model load takes seconds (tens on a loaded machine), so it is never silent::

    loading the embedding model minilm (sentence-transformers/all-MiniLM-L6-v2) ...
    loaded the embedding model minilm in 4.2s

Inside a task attempt stderr is the attempt's log (``pipeline logs RUN --task
KEY``, echoed live with ``--logs``); in ``pipeline search`` it is the terminal,
so stdout (``--json``) stays clean. Embedder plugins that load lazily wrap
their load in :func:`loading`; it is said once per process, since
:func:`ledgerflow_embed.get_embedder` builds an embedder once per process.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["loading"]


@contextmanager
def loading(name: str, detail: str = "") -> Iterator[None]:
    """Say on stderr that the model ``name`` loads in this block, and how long it took.

    Example:
        >>> with loading("my-model", "weights.bin"):  # doctest: +SKIP
        ...     model = load_weights()
    """
    what = f"{name} ({detail})" if detail else name
    print(f"loading the embedding model {what} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    yield
    print(f"loaded the embedding model {name} in {time.monotonic() - started:.1f}s",
          file=sys.stderr, flush=True)
