"""One contract for every run store (third-party stores can run it too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerflow.testing import STORE_FACTORIES, StoreContract

# The contract classes are collected once per store below.
for _name, _factory in STORE_FACTORIES.items():
    globals()[f"TestContract_{_name}"] = type(
        f"TestContract_{_name}", (StoreContract,), {"make_store": staticmethod(_factory)})


def test_factories_cover_built_in_stores(tmp_path: Path) -> None:
    assert {"memory", "duckdb"} <= set(STORE_FACTORIES)
    pytest.importorskip("duckdb")
