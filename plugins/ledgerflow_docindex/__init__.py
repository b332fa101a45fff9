"""The doc_index recipe's plugin: the index file, its search, and ``pipeline search``.

The recipe (``recipes/doc_index/pipeline.py``) writes the index; everything
that reads or writes the index file lives here, in an installed package, so
that the ``pipeline`` CLI and a console can search an index without the
recipe's folder:

* :mod:`ledgerflow_docindex.store`: the tables, the file lock, writes, prune,
  the chunk-level embedding cache, ``explain`` (a façade over the package
  :mod:`ledgerflow_docindex.index`, one module per concept);
* :mod:`ledgerflow_docindex.search`: :func:`~ledgerflow_docindex.search.search`
  and :func:`~ledgerflow_docindex.search.search_many` returning hit records;
* :mod:`ledgerflow_docindex.terms`: the keyword tokenizer;
* ``pipeline search INDEX "query" ["query" ...]`` (this module's CLI hook).

Registered in the ``ledgerflow`` entry-point group as ``doc_index``. Importing
this package is cheap: DuckDB, Arrow and the embedders load when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerflow import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    """Add ``pipeline search``."""
    from .cli import search_command

    group.add_command(search_command)
