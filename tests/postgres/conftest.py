"""Fixtures of the postgres store tests: one real server per session, a database per test.

The server is started by the suite itself (see :mod:`tests.postgres.pgserver`);
the tests skip, saying why, only when no server binary can be had.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .pgserver import PgServer, started_or_skip

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server on 127.0.0.1 and a free port, for the whole session."""
    server = started_or_skip()
    yield server
    server.destroy()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """The URL of a fresh, empty ledger on the session's server (its own schema)."""
    return pg_server.create_schema(f"lf_{os.getpid()}_{next(_names)}")


@pytest.fixture(autouse=True)
def _blob_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large results of each test go to its own temp dir (the 'shared' directory)."""
    monkeypatch.setenv("LEDGERFLOW_BLOB_DIR", str(tmp_path / "blobs"))
