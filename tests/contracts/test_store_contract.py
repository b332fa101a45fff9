"""One contract for every built-in run store (third-party stores can run it too)."""

from __future__ import annotations

from pathlib import Path

from ledgerflow.testing import StoreContract


class TestMemoryStore(StoreContract):
    store_name = "memory"

    def store_location(self, tmp_path: Path) -> str:
        return f"memory:{tmp_path}"


class TestDuckDBStore(StoreContract):
    store_name = "duckdb"

    def store_location(self, tmp_path: Path) -> str:
        return str(tmp_path / "ledger.duckdb")
