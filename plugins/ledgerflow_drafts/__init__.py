"""Natural-language drafts of declarative specs: ``pipeline draft`` and :func:`draft`.

A model (any provider of :mod:`ledgerflow_agents`: ``mock``, ``local``,
``openai:...``) turns a request in plain words into a spec over a catalogue
of ``@task`` functions; the draft is validated, repaired from the
validator's problem objects a bounded number of times, and written with a
header that marks it machine-written, with its digest. The drafting is
itself a ledgerflow run (:mod:`ledgerflow_drafts.agent`), so its model calls
are in the ledger. A machine-written draft runs only once a person has
approved its digest (``pipeline approve-draft``; :mod:`ledgerflow.specs.drafts`).

Example:
    >>> from ledgerflow_drafts import draft
    >>> run = draft("index the markdown files in docs/ into docs.duckdb",
    ...             tasks=["recipes/doc_index/pipeline.py"], output="draft.toml",
    ...             model="local")                                  # doctest: +SKIP
    >>> run.result()["digest"]                                      # doctest: +SKIP
    '3fa9c2d1e0b4...'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerflow import hookimpl

if TYPE_CHECKING:
    import click

    from ledgerflow.launch import Run
    from ledgerflow.opening import StoreArg

__all__ = ["absolute_sources", "draft"]


def absolute_sources(sources: Sequence[str]) -> list[str]:
    """Task sources with ``.py`` paths made absolute (a resume may start elsewhere)."""
    return [str(Path(s).resolve()) if s.endswith(".py") or os.sep in s else s
            for s in sources]


def draft(request: str, *, tasks: Sequence[str], output: str, model: str = "mock",
          policy: str | None = None, repairs: int = 2, store: StoreArg = None,
          max_tokens: int | None = None, progress: Any = None) -> Run:
    """Draft a spec for ``request`` over the tasks in ``tasks``; write it to ``output``.

    Runs the ``drafting`` pipeline (inline) and returns its :class:`~ledgerflow.Run`;
    ``run.result()`` is ``{"path", "digest", "valid", "problems", "rounds", ...}``.
    """
    from ledgerflow.launch import start

    from .agent import MAX_TOKENS, drafting
    params = {"request": request, "tasks": absolute_sources(tasks),
              "output": str(Path(output).resolve()),
              "base": str(Path(output).resolve().parent), "model": model,
              "policy": str(Path(policy).resolve()) if policy else None,
              "repairs": int(repairs), "max_tokens": int(max_tokens or MAX_TOKENS)}
    return start(drafting, (), params, store=store, executor="inline", progress=progress)


@hookimpl
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    """Add ``pipeline draft``."""
    from .cli import draft_command
    group.add_command(draft_command)
