"""The ``duckdb`` store plugin: the default ledger (a DuckDB file plus journals).

Modules, one concept each: :mod:`.store` (the store façade), :mod:`.schema`
(tables and migrations), :mod:`.connection` (opening the file, lock waits),
:mod:`.journal` (segments and their lines), :mod:`.fold` (journals into
tables, in batches), :mod:`.batch` (one batch's set-based SQL), :mod:`.lease` (leases, heartbeat, liveness, cancel requests),
:mod:`.queries` (reads of the tables), :mod:`.engine` (DuckDB's engine, without its
Python API); the reads themselves are
:class:`ledgerflow.ledger.RecordReads`, result files :mod:`ledgerflow.blobs`.
"""

from __future__ import annotations

from ledgerflow import hookimpl
from ledgerflow.config import Settings

from .fold import FoldPolicy
from .store import DuckDBStore

__all__ = ["DuckDBStore", "FoldPolicy"]


@hookimpl
def ledgerflow_store_names() -> list[str]:
    return ["duckdb"]


@hookimpl
def ledgerflow_make_store(name: str, settings: Settings) -> DuckDBStore | None:
    if name != "duckdb":
        return None
    return DuckDBStore(settings.store)
