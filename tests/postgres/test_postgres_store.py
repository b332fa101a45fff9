"""The postgres store in one process: idempotent retried commits, fencing, waiting, runs.

Every test talks to a real PostgreSQL server (the session's, one database
per test) through the store plugin, as a run does.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow.context import TaskCancelled
from ledgerflow.control import submit
from ledgerflow.errors import LeaseLostError, NotResumableError, StoreError
from ledgerflow.opening import settings_for, store_for
from ledgerflow.records import (
    AttemptEnded,
    ResultRecorded,
    RunStateChanged,
    Transition,
    encode_line,
)
from ledgerflow.testing.stores import run_records, started
from ledgerflow_postgres import PostgresStore
from ledgerflow_postgres.connection import StoreUnavailableError
from ledgerflow_postgres.sql import COMMIT_SQL, commit_params
from tests.waiting import wait_until

from .pgserver import free_port

pytestmark = pytest.mark.postgres


def rows(url: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as con:
        return con.execute(sql, params).fetchall()


@pytest.fixture
def store(pg_url: str) -> Any:
    st = PostgresStore(pg_url, lease_ttl=5, wait=10)
    yield st
    st.close()


class Flaky:
    """A connection that breaks once around a statement (the group commit by default),
    like a server stopped mid-commit: ``after=True`` breaks after the statement ran (the client cannot
    tell that it landed), ``after=False`` before it reached the server."""

    def __init__(self, con: Any, after: bool, marker: str = "INSERT INTO commits") -> None:
        self.con, self.after, self.broke, self.marker = con, after, False, marker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)

    def execute(self, sql: str, params: Any = None) -> Any:
        if not self.broke and self.marker in sql:
            self.broke = True
            if self.after:
                self.con.execute(sql, params)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return self.con.execute(sql, params)


@pytest.mark.parametrize("after", [True, False], ids=["landed", "not-landed"])
def test_a_commit_retried_after_a_lost_connection_is_applied_once(
        store: PostgresStore, pg_url: str, after: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    lease = store.create_run("r", run_records("r"))
    real = store.conns.writer()
    store.conns.wconn = Flaky(real, after)
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="ledgerflow"):
        store.append(lease, started("a", now))
    assert "unreachable while committing to run r" in caplog.text
    assert "is back after" in caplog.text
    assert rows(pg_url, "SELECT token, seq, records FROM commits ORDER BY seq") == [
        (1, 1, 3), (1, 2, 4)]
    assert store.get_run("r").tasks["a"].state == "running"     # read before the fold
    store.fold()
    assert rows(pg_url, "SELECT seq, to_state FROM events ORDER BY seq") == [
        (1, "pending"), (2, "ready"), (3, "running")]
    # and the next commit goes on from there
    store.append(lease, [AttemptEnded("a", 1, "ok", now, now, "", "", ""),
                         ResultRecorded("a", 1, "fp", "h", "json", "1", None, 1, None),
                         Transition(4, "a", 1, "running", "succeeded", "", now)])
    row = store.get_run("r").tasks["a"]
    assert (row.state, row.attempts, row.result_hash) == ("succeeded", 1, "h")
    store.release(lease)


def test_the_same_commit_sent_twice_writes_once(store: PostgresStore, pg_url: str) -> None:
    lease = store.create_run("r", run_records("r"))
    recs = started("a", time.time())
    params = commit_params("r", 1, 2, encode_line(recs)[:-1], len(recs))
    with psycopg.connect(pg_url, autocommit=True) as con:
        first = con.execute(COMMIT_SQL, params).fetchone()
        again = con.execute(COMMIT_SQL, params).fetchone()
        stale = con.execute(COMMIT_SQL, {**params, "token": 7, "seq": 3}).fetchone()
    assert (first, again, stale) == ((1,), None, None)
    assert rows(pg_url, "SELECT token, seq FROM commits ORDER BY seq") == [(1, 1), (1, 2)]
    store.release(lease)


def test_a_superseded_driver_writes_nothing(pg_url: str) -> None:
    old = PostgresStore(pg_url, lease_ttl=30, wait=5)
    new = PostgresStore(pg_url, lease_ttl=30, wait=5)
    try:
        lease = old.create_run("r", run_records("r"))
        with pytest.raises(NotResumableError, match="still being driven by pid"):
            new.take_over("r")
        # the old driver looks dead to the server: its lease is past its expiry
        rows(pg_url, "UPDATE leases SET expires_at = now() - interval '1 second' "
                     "RETURNING 1")
        taken = new.take_over("r")
        assert taken.token == 2
        before = rows(pg_url, "SELECT (SELECT count(*) FROM events), "
                              "(SELECT count(*) FROM commits)")
        with pytest.raises(LeaseLostError, match="lease lost: run r was taken over"):
            old.append(lease, started("a", time.time()))
        assert rows(pg_url, "SELECT (SELECT count(*) FROM events), "
                            "(SELECT count(*) FROM commits)") == before
        assert old.lease_lost(lease) is not None
        old.release(lease)           # writes nothing: the lease is the new driver's
        assert rows(pg_url, "SELECT token, expires_at > now() FROM leases") == [(2, True)]
        new.append(taken, [RunStateChanged("running", "resumed", time.time())])
        new.release(taken)
    finally:
        old.close()
        new.close()


def test_a_driver_that_cannot_renew_in_time_fences_itself(pg_url: str) -> None:
    st = PostgresStore(pg_url, lease_ttl=1.0, wait=5)
    try:
        lease = st.create_run("r", run_records("r"))
        st.keeper._renew = lambda run_id, h: None      # type: ignore[method-assign]
        assert st.lease_lost(lease) is None
        time.sleep(1.1)
        reason = st.lease_lost(lease)
        assert reason is not None and "could not renew the lease of run r for 1s" in reason
        with pytest.raises(LeaseLostError, match="could not renew"):
            st.append(lease, started("a", time.time()))
        assert rows(pg_url, "SELECT count(*) FROM events") == [(0,)]
        st.release(lease)
    finally:
        st.close()


def test_leases_are_renewed_on_the_servers_clock(pg_url: str) -> None:
    st = PostgresStore(pg_url, lease_ttl=0.6, wait=5)
    try:
        lease = st.create_run("r", run_records("r"))
        first = rows(pg_url, "SELECT renewed_at FROM leases")[0][0]
        time.sleep(1.0)       # ~5 renewals at a third of the TTL
        renewed, left = rows(pg_url, "SELECT renewed_at, extract(epoch FROM expires_at - "
                                     "now()) FROM leases")[0]
        assert renewed > first and 0 < float(left) <= 0.6
        assert st.lease_lost(lease) is None
        st.release(lease)
        assert rows(pg_url, "SELECT expires_at <= now() FROM leases") == [(True,)]
    finally:
        st.close()


def test_a_stopped_database_is_waited_for_then_store_unavailable(
        caplog: pytest.LogCaptureFixture) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nobody listens there
    st = PostgresStore(url, wait=1.0)
    with caplog.at_level(logging.WARNING, logger="ledgerflow"), pytest.raises(
            StoreUnavailableError, match="store unavailable: database "
            r"postgresql://postgres@127.0.0.1:\d+/nothing did not answer"):
        st.list_runs()
    assert "waiting up to 1s for it" in caplog.text      # it waited, then gave up
    st.close()


def test_a_missing_database_fails_at_once(pg_server: Any,
                                          caplog: pytest.LogCaptureFixture) -> None:
    st = PostgresStore(pg_server.url_for("no_such_db"), wait=30)
    with caplog.at_level(logging.WARNING, logger="ledgerflow"), pytest.raises(
            StoreError, match="cannot use the database") as info:
        st.list_runs()
    assert not isinstance(info.value, StoreUnavailableError)
    assert "waiting up to" not in caplog.text           # refused, not waited for
    st.close()


def test_passwords_are_masked_in_messages() -> None:
    from ledgerflow_postgres.connection import mask
    assert mask("postgresql://me:s3cret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert mask("postgresql://me@db/x") == "postgresql://me@db/x"


# -- runs through the API ---------------------------------------------------------------

@task
def double(x: int) -> int:
    return 2 * x


@task
def total(xs: list[int]) -> int:
    return sum(xs)


@task(retries=0)
def fragile(x: int, fail: bool) -> int:
    if fail and x == 2:
        raise ValueError("boom")
    return x


@pipeline
def sums(n: int = 4):
    return total(double.map(list(range(n))))


@pipeline
def breaks(fail: bool = True):
    return fragile.map([1, 2, 3], fail=fail)


def test_runs_cache_and_resume_on_postgres(pg_url: str) -> None:
    first = sums.run(n=4, store=pg_url)
    assert first.state == "succeeded" and first.result() == 12
    again = sums.run(n=4, store=pg_url)
    assert {t["cached"] for t in again.tasks()} == {True}
    assert again.result() == 12
    failed = breaks.run(store=pg_url)
    assert failed.state == "failed"
    view = failed.status()
    assert view.tasks["fragile[2]"].error == "ValueError: boom"
    assert view.driver_alive is False
    # the ledger's own rows, through users' SQL
    assert rows(pg_url, "SELECT state, count(*) FROM tasks WHERE run_id = %s "
                        "GROUP BY state ORDER BY state", [failed.run_id]) == [
        ("failed", 1), ("succeeded", 2)]
    lineage = rows(pg_url, "SELECT task_key, direction, uri FROM lineage WHERE run_id = %s "
                           "AND task_key = 'total' ORDER BY uri", [first.run_id])
    assert [r[2] for r in lineage] == [f"task:double[{i}]" for i in range(4)] + ["task:total"]


def test_tables_have_the_duckdb_stores_names_and_columns(pg_url: str, tmp_path: Path) -> None:
    import duckdb
    sums.run(n=2, store=pg_url)
    sums.run(n=2, store=str(tmp_path / "l.duckdb")).settle()    # (then read as plain SQL)
    con = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    duck: dict[str, list[str]] = {}
    for table, column in con.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "ORDER BY table_name, ordinal_position").fetchall():
        duck.setdefault(table, []).append(column)
    con.close()
    pg: dict[str, list[str]] = {}
    for table, column in rows(pg_url, "SELECT table_name, column_name FROM "
                                      "information_schema.columns WHERE table_schema = "
                                      "current_schema() ORDER BY table_name, "
                                      "ordinal_position"):
        pg.setdefault(table, []).append(column)
    # journals, and how it keeps a task's plain moves, attempt and result in its row
    # (its ``events``, ``attempts`` and ``results`` views read them), are the DuckDB
    # store's own; the rest is shared
    from ledgerflow_stores.duckdb.schema import DERIVED_COLUMNS
    own = {c.split()[0] for c in DERIVED_COLUMNS}
    for table in set(duck) - {"journal_folds", "journal_damage", "event_rows", "result_rows",
                              "attempt_rows"}:
        assert table in pg, table
        missing = [c for c in duck[table] if c not in pg[table] and c not in own]
        assert not missing, (table, missing)
    assert pg["lineage"] == duck["lineage"]


def test_cancel_from_another_process_reaches_the_driver(pg_url: str, tmp_path: Path) -> None:
    gate = tmp_path / "started"

    @task
    def wait_here(i: int) -> int:
        gate.touch()
        ctx = ledgerflow.context()
        for _ in range(400):
            if ctx.cancel_requested:
                raise TaskCancelled()
            time.sleep(0.025)
        return i

    @pipeline
    def slow():
        return wait_here.map([1, 2])

    run = slow.run(store=pg_url, wait=False)
    wait_until(gate.exists, what="a task to start")
    other = store_for(settings_for(pg_url))     # a reader elsewhere: its own store object
    ledgerflow.cancel(run.run_id, store=other)
    assert run.wait() == "cancelled"
    # (a task that never saw the cancel would have run its 400 rounds and succeeded)
    assert {r.state for r in run.status().tasks.values()} == {"cancelled"}
    other.close()


def test_submit_then_resume_drives_the_run_once(pg_url: str) -> None:
    run_id = submit(sums, params={"n": 3}, store=pg_url)
    view = ledgerflow.get_run(run_id, store=pg_url).status()
    assert (view.state, view.tasks, view.driver_alive) == ("submitted", {}, False)
    done = ledgerflow.resume(run_id, store=pg_url, pipeline=sums)
    assert done.state == "succeeded" and done.result() == 6
    assert rows(pg_url, "SELECT token FROM runs WHERE run_id = %s", [run_id]) == [(2,)]


def test_large_results_go_to_the_shared_directory(pg_url: str, tmp_path: Path) -> None:
    @task
    def big() -> list[int]:
        return list(range(5000))

    @pipeline
    def one():
        return big()

    run = one.run(store=pg_url)
    uri = rows(pg_url, "SELECT result_uri FROM tasks WHERE run_id = %s", [run.run_id])[0][0]
    assert uri.startswith("results/") and (tmp_path / "blobs" / uri).exists()
    assert run.result() == list(range(5000))


def test_reads_from_threads_while_a_run_commits(pg_url: str) -> None:
    run = sums.run(n=200, store=pg_url, wait=False)
    seen: list[str] = []

    def watch() -> None:
        while not run.done:
            seen.append(run.status().state)
    t = threading.Thread(target=watch)
    t.start()
    assert run.wait(60) == "succeeded"
    t.join()
    assert seen and set(seen) <= {"running", "succeeded"}


def test_unfolded_commits_are_read_and_a_takeover_folds_them(pg_url: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A driver dies before its commits were folded into the tables: readers see them
    anyway (tables + commits), and the driver that takes over folds them."""
    from ledgerflow.projection import apply
    from ledgerflow.views import RunView
    old = PostgresStore(pg_url, lease_ttl=30, wait=5)
    monkeypatch.setattr(old.folder, "start", lambda: None)     # it dies before any fold
    lease = old.create_run("r", run_records("r"))
    now = time.time()
    commits = [started("a", now),
               [AttemptEnded("a", 1, "ok", now, now + 1, "", "", ""),
                ResultRecorded("a", 1, "fp", "h", "json", "1", None, 1, None),
                Transition(4, "a", 1, "running", "succeeded", "", now + 1)],
               started("b", now + 2, seq=5)]
    for c in commits:
        old.append(lease, c)
    assert rows(pg_url, "SELECT count(*) FROM events") == [(0,)]     # nothing folded
    reader = PostgresStore(pg_url, wait=5)
    expected = apply(RunView("r"), [*run_records("r"), *(r for c in commits for r in c)])
    got = reader.get_run("r")
    assert {k: (t.state, t.attempts, t.result_hash) for k, t in got.tasks.items()} == {
        "a": ("succeeded", 1, "h"), "b": ("running", 1, None)}
    assert got.max_seq == expected.max_seq == 7
    assert [a["outcome"] for a in reader.attempts("r")] == ["ok"]
    assert reader.list_runs()[0].counts() == {"succeeded": 1, "running": 1}
    # the driver is gone (its lease expired); another takes over and folds its commits
    rows(pg_url, "UPDATE leases SET expires_at = now() - interval '1 second' RETURNING 1")
    new = PostgresStore(pg_url, lease_ttl=30, wait=5)
    try:
        taken = new.take_over("r")
        assert rows(pg_url, "SELECT count(*), count(DISTINCT seq) FROM events") == [(7, 7)]
        table = {k: (s, a, h) for k, s, a, h in rows(
            pg_url, "SELECT task_key, state, attempts, result_hash FROM tasks")}
        assert table == {k: (t.state, t.attempts, t.result_hash)
                         for k, t in expected.tasks.items()}
        assert rows(pg_url, "SELECT max_seq, token FROM runs") == [(7, 1)]
        new.release(taken)
    finally:
        new.close()
        reader.close()
        monkeypatch.undo()
        old.close()


@pytest.mark.parametrize("after", [True, False], ids=["landed", "not-landed"])
def test_a_fold_retried_after_a_lost_connection_is_applied_once(
        store: PostgresStore, pg_url: str, after: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store.folder, "start", lambda: None)    # folds only when told
    lease = store.create_run("r", run_records("r"))
    store.append(lease, started("a", time.time()))
    store.conns.fconn = Flaky(store.conns.folder(), after, marker="UPDATE folds f SET")
    store.fold()       # breaks once, waits, checks the fold position, goes on
    store.append(lease, [Transition(4, "a", 1, "running", "succeeded", "", time.time())])
    store.fold()
    assert rows(pg_url, "SELECT seq FROM events ORDER BY seq") == [(1,), (2,), (3,), (4,)]
    assert rows(pg_url, "SELECT state FROM tasks") == [("succeeded",)]
    assert rows(pg_url, "SELECT token, seq FROM folds") == [(1, 3)]
    store.release(lease)


def test_a_postgresql_url_selects_the_postgres_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerflow.config import Settings
    assert settings_for("postgresql://db/ledger").store_kind == "postgres"
    assert settings_for("postgres://db/ledger").store_kind == "postgres"
    assert settings_for("ledger.duckdb").store_kind == "duckdb"
    monkeypatch.setenv("LEDGERFLOW_STORE", "postgresql://db/ledger")
    assert Settings.from_env().store_kind == "postgres"
    assert settings_for().store == "postgresql://db/ledger"
    monkeypatch.setenv("LEDGERFLOW_STORE_KIND", "duckdb")       # an explicit kind wins
    assert Settings.from_env().store_kind == "duckdb"


def test_a_submitted_run_cancelled_before_a_worker_took_it_is_never_claimed(
        pg_url: str) -> None:
    run_id = submit(sums, params={"n": 2}, store=pg_url)
    ledgerflow.cancel(run_id, store=pg_url)
    assert ledgerflow.get_run(run_id, store=pg_url).status().state == "cancelled"
    st = PostgresStore(pg_url, wait=5)
    try:
        assert st.claim() is None
    finally:
        st.close()


def test_recover_doctor_and_repair(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a gone driver left is folded by recover() (every writing command calls it);
    doctor says so first; repair rebuilds damaged rows from the commits."""
    dead = PostgresStore(pg_url, lease_ttl=30, wait=5)
    monkeypatch.setattr(dead.folder, "start", lambda: None)
    lease = dead.create_run("r", run_records("r"))
    now = time.time()
    dead.append(lease, started("a", now))
    dead.append(lease, [AttemptEnded("a", 1, "ok", now, now, "", "", ""),
                        ResultRecorded("a", 1, "fp", "h", "json", "1", None, 1, None),
                        Transition(4, "a", 1, "running", "succeeded", "", now),
                        RunStateChanged("succeeded", "", now)])
    rows(pg_url, "UPDATE leases SET expires_at = now() - interval '1 second' RETURNING 1")
    st = PostgresStore(pg_url, wait=5)
    try:
        found = st.doctor()
        assert any(f["problem"] and "left commits not folded" in f["what"] for f in found)
        assert st.cache_lookup(["a"]) == {}          # the cache index reads the tables
        st.recover()
        assert st.cache_lookup(["a"])["fp"][:2] == ("r", "a")
        assert rows(pg_url, "SELECT state FROM tasks") == [("succeeded",)]
        assert not [f for f in st.doctor() if f["problem"]]
        # damage the derived rows by hand: repair rebuilds them from the commits
        rows(pg_url, "DELETE FROM events RETURNING 1")
        rows(pg_url, "UPDATE tasks SET state = 'pending', attempts = 0 RETURNING 1")
        kept, notes = st.repair()
        assert (kept, notes) == ("", ["run r: rebuilt from its commits"])
        assert rows(pg_url, "SELECT count(*) FROM events") == [(4,)]
        assert rows(pg_url, "SELECT state, attempts, result_hash FROM tasks") == [
            ("succeeded", 1, "h")]
        assert rows(pg_url, "SELECT state, max_seq FROM runs") == [("succeeded", 4)]
        # a driven run is never rewritten under its driver
        live = st.create_run("r2", run_records("r2"))
        with pytest.raises(StoreError, match="run r2 is being driven"):
            st.repair()
        st.release(live)
    finally:
        st.close()
        monkeypatch.undo()
        dead.close()


def test_the_cli_reads_and_checks_a_postgres_ledger(pg_url: str) -> None:
    from click.testing import CliRunner

    from ledgerflow.cli import main
    run = sums.run(n=2, store=pg_url)
    cli = CliRunner()
    for args, expect in ((["runs"], run.run_id), (["status", run.run_id], "succeeded"),
                         (["lineage", run.run_id, "--task", "total"], "task:double[1]"),
                         (["fold"], "folded 0 run(s)"), (["doctor"], "no problems found")):
        res = cli.invoke(main, [*args, "--store", pg_url])
        assert res.exit_code == 0 and expect in res.output, (args, res.output)


def test_a_big_cache_index_is_read_on_the_first_hit(store: PostgresStore) -> None:
    from ledgerflow.store import CacheIndex
    from tests.unit.test_cache_index import squares

    first = squares.run(start=0, store=store, executor="inline")
    store.cache_entries_at_start = 3
    assert isinstance(store.cache_lookup(["square"]), CacheIndex)
    fresh = squares.run(start=100, store=store, executor="inline")   # no hit
    assert not any(t["cached"] for t in fresh.tasks())
    again = squares.run(start=5, store=store, executor="inline")     # 5 hits
    assert again.result() == [i * i for i in range(5, 15)]
    cached = [t.cached_from for t in again.status().tasks.values() if t.cached_from]
    assert len(cached) == 5 and all(c.startswith(first.run_id) for c in cached)
