"""A tool's ``sqlite3.connect`` counts as a write of the database file: C code opens it, so
no ``open`` audit event is raised and, before, a tool created a database anywhere."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ledgerflow_agents.errors import PathNotAllowed
from ledgerflow_agents.guard import Guard, guarded


def _store(database: str) -> int:
    """A tool's code: write a row to the database the model named."""
    con = sqlite3.connect(database, uri=database.startswith("file:"))
    try:
        con.execute("CREATE TABLE IF NOT EXISTS t (x)")
        con.execute("INSERT INTO t VALUES (1)")
        con.commit()
        return int(con.execute("SELECT count(*) FROM t").fetchone()[0])
    finally:
        con.close()


def test_a_database_outside_the_write_roots_is_refused_inside_is_fine(tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    roots.mkdir()
    g = Guard("store", reads=(), writes=(str(roots),), code=Guard.code_of(_store))
    with guarded(g):
        for outside in (str(tmp_path / "outside.db"), f"file:{tmp_path}/uri.db?mode=rwc"):
            with pytest.raises(PathNotAllowed, match="may not write"):
                _store(outside)
        assert _store(str(roots / "inside.db")) == 1
        assert _store(":memory:") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roots"]
    assert [k for k, _ in g.violations] == ["path_not_allowed"] * 2
