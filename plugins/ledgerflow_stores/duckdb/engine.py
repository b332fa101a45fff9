"""DuckDB's engine alone: the C++ extension the ledger calls, without the Python API around it.

``import duckdb`` takes about 60 ms, most of it DuckDB's Python-level
relational API (``duckdb._relation``, expressions, the Arrow and Polars
sources), which the ledger never uses: it connects, runs SQL and catches
DuckDB's exceptions. Those are the extension's own objects, which ``duckdb``
re-exports (``duckdb.Error is _duckdb.Error``), and the extension alone
imports in about 17 ms, so every command that opens a ledger starts sooner. A
DuckDB laid out otherwise (no ``_duckdb`` extension module, or one without
what the ledger uses) is imported whole. Code that wants the relational API
imports ``duckdb`` itself; both work on the same process at once.
"""

from __future__ import annotations

import importlib
from typing import Any

#: What the ledger uses of DuckDB's module (its connections' ``execute``,
#: ``fetchone``, ``fetchall``, ``cursor`` and ``close`` are the extension's too).
USED = ("connect", "Error", "BinderException", "CatalogException", "ConversionException",
        "InternalException", "InvalidInputException", "IOException",
        "OutOfMemoryException", "SerializationException")


def load() -> Any:
    """DuckDB's C++ extension module if it has what the ledger uses, else ``duckdb``."""
    try:
        core = importlib.import_module("_duckdb")
    except ImportError:
        return importlib.import_module("duckdb")
    if all(hasattr(core, name) for name in USED):
        return core
    return importlib.import_module("duckdb")


duckdb: Any = load()
