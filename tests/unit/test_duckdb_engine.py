"""The DuckDB store calls DuckDB's engine alone (``_duckdb``), and DuckDB's whole module
where the engine is laid out otherwise: the ledger works the same either way."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from ledgerflow_stores.duckdb import engine


def test_the_engine_is_the_extension_duckdb_re_exports() -> None:
    pytest.importorskip("_duckdb", reason="this DuckDB ships no engine module of its own")
    core = engine.load()
    assert core.__name__ == "_duckdb"
    for name in engine.USED:        # the very objects `duckdb` offers: except clauses match
        assert getattr(core, name) is getattr(duckdb, name)


def _without(monkeypatch: pytest.MonkeyPatch, *, missing: bool) -> None:
    real = importlib.import_module

    def fake(name: str, *args: Any) -> Any:
        if name != "_duckdb":
            return real(name, *args)
        if missing:
            raise ImportError("No module named '_duckdb'")
        return type(sys)("_duckdb")         # an extension without what the ledger uses
    monkeypatch.setattr(importlib, "import_module", fake)


@pytest.mark.parametrize("missing", [True, False], ids=["no-extension", "other-layout"])
def test_a_duckdb_laid_out_otherwise_is_imported_whole(monkeypatch: pytest.MonkeyPatch,
                                                      missing: bool) -> None:
    _without(monkeypatch, missing=missing)
    assert engine.load() is duckdb


def test_a_ledger_written_without_duckdbs_python_api_reads_back_with_it(
        tmp_path: Path) -> None:
    store = tmp_path / "ledger.duckdb"
    code = ("import sys\n"
            "from ledgerflow import task, pipeline\n"
            "@task\n"
            "def double(x: int) -> int:\n"
            "    return 2 * x\n"
            "@pipeline\n"
            "def p(n: int = 4):\n"
            "    return double.map(list(range(n)))\n"
            f"run = p.run(store={str(store)!r}, executor='inline').settle()\n"
            "print(run.state, run.result(), 'duckdb' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split("\n")[-2] == "succeeded [0, 2, 4, 6] False"
    con = duckdb.connect(str(store), read_only=True)        # the whole module reads it
    try:
        states = con.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall()
    finally:
        con.close()
    assert states == [("succeeded", 4)]
