"""A database that stays away: waited out for LEDGERFLOW_STORE_WAIT (minutes by default),
saying so while it waits, then "store unavailable" (exit code 1) (issue 31 #9)."""

from __future__ import annotations

import logging
import socket

import pytest

pytest.importorskip("psycopg")

from ledgerflow_postgres.connection import (
    DEFAULT_WAIT,
    Database,
    StoreUnavailableError,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])      # nothing listens there once closed


def test_the_default_wait_outlasts_a_server_restart() -> None:
    assert DEFAULT_WAIT >= 120


def test_an_outage_longer_than_the_wait_says_it_waits_then_ends_unavailable(
        caplog: pytest.LogCaptureFixture) -> None:
    db = Database(f"postgresql://lf@127.0.0.1:{_closed_port()}/lf", wait=2.5)
    db.progress_every = 0.5
    calls = []

    def attempt(retry: bool) -> None:
        calls.append(retry)
        con = db.connect(timeout=1)
        con.close()
    with caplog.at_level(logging.WARNING, logger="ledgerflow"), \
            pytest.raises(StoreUnavailableError) as err:
        db.retrying(attempt, what="testing")
    assert err.value.exit_code == 1
    assert "store unavailable" in str(err.value)
    said = [r.getMessage() for r in caplog.records]
    assert any("unreachable while testing" in m and "up to 2.5s" in m for m in said), said
    progress = [m for m in said if "still waiting for database" in m]
    assert len(progress) >= 2, said
    assert len(calls) > 2 and calls[0] is False and all(calls[1:])
