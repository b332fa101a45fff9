"""The store contract on a real PostgreSQL server (the same suite as duckdb and memory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerflow.store import RunStore
from ledgerflow.testing import StoreContract

pytestmark = pytest.mark.postgres


class TestPostgresStore(StoreContract):
    store_name = "postgres"

    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> Iterator[None]:
        self._url = pg_url
        self._stores: list[Any] = []
        yield
        for st in self._stores:
            st.close()

    def store_location(self, tmp_path: Path) -> str:
        return self._url

    def make_store(self, tmp_path: Path) -> RunStore:
        st = super().make_store(tmp_path)
        self._stores.append(st)
        return st
