"""The DuckDB ledger answers exactly as the in-memory one for the same runs."""

from __future__ import annotations

import json
import threading
import time

import pytest

import ledgerflow
import ledgerflow.runner
from ledgerflow import context, pipeline, task
from ledgerflow.errors import ConfigError
from ledgerflow_stores.duckdb import DuckDBStore, FoldPolicy
from tests.waiting import wait_until


@task(retries=1)
def maybe(i: int) -> int:
    if i % 97 == 0:
        raise ValueError(f"item {i}")
    return i


@task
def total(xs: list[int]) -> int:
    return sum(xs)


@pipeline
def fan(n: int):
    return total(maybe.map(list(range(n))))


def _unfolded(path, **policy) -> DuckDBStore:
    """A store whose drivers leave their journal unfolded, as a killed driver does."""
    return DuckDBStore(str(path), policy=FoldPolicy(fold_at_release=False, interval=3600,
                                                    **policy))


def _rows(view):
    return {k: (t.state, t.attempts, t.error, t.result_hash, t.cached_from is None, t.position)
            for k, t in view.tasks.items()}


@pytest.mark.parametrize(("n", "batch"), [(30, None), (3000, None), (3000, 20_000)],
                         ids=["small", "large", "large-in-many-batches"])
def test_fold_matches_the_memory_store(tmp_path, n: int, batch: int | None) -> None:
    policy = FoldPolicy() if batch is None else FoldPolicy(batch_bytes=batch)
    mem = fan.run(n=n, store=f"memory:{tmp_path}", executor="inline")
    disk = fan.run(n=n, store=DuckDBStore(str(tmp_path / "l.duckdb"), policy=policy),
                   executor="inline").settle()
    a, b = mem.status(), disk.status()
    assert a.state == b.state == "failed"
    assert _rows(a) == _rows(b)
    # and read back from the folded tables alone (the journal is gone after the fold)
    assert not list((tmp_path / "l.duckdb.d" / "journals").glob("*.jsonl"))
    assert [x["outcome"] for x in disk.attempts("maybe[0]")] == ["error", "error"]


@task
def one(i: int) -> int:
    return i


@pipeline
def wide(n: int):
    return total([one(i) for i in range(n)])


def test_commits_are_bounded_and_fold_like_the_memory_store(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ledgerflow.runner, "COMMIT_RECORDS", 60)
    disk = fan.run(n=500, store=_unfolded(tmp_path / "l.duckdb", batch_bytes=4000),
                   executor="inline")
    (journal,) = (tmp_path / "l.duckdb.d" / "journals").glob("*.jsonl")
    lines = [json.loads(x.rsplit(b"\t", 1)[0]) for x in journal.read_bytes().splitlines()]
    # the runner writes the 500 tasks' creation records in groups of whole tasks (one
    # record a task: created, pending and ready), and the inline fan-out commits in
    # bounded groups
    assert max(len(x) for x in lines) < 100
    assert sum(r[0] == "T" for x in lines for r in x) == 501
    assert all(len(x) == 60 and {r[0] for r in x} == {"T"} for x in lines[1:9])
    monkeypatch.undo()
    DuckDBStore(str(tmp_path / "l.duckdb"), policy=FoldPolicy(batch_bytes=4000)).fold()
    mem = fan.run(n=500, store=f"memory:{tmp_path}", executor="inline")
    assert _rows(mem.status()) == _rows(disk.status())


def test_a_crash_while_tasks_are_created_leaves_a_prefix_that_resumes(tmp_path, monkeypatch) -> None:
    store = str(tmp_path / "l.duckdb")
    monkeypatch.setattr(ledgerflow.runner, "COMMIT_RECORDS", 30)
    first = wide.run(n=200, store=_unfolded(store), executor="inline")
    monkeypatch.undo()
    (journal,) = (tmp_path / "l.duckdb.d" / "journals").glob("*.jsonl")
    lines = journal.read_bytes().splitlines(keepends=True)
    # keep the run's header and the first three groups of creation records, then a
    # torn line: what a kill -9 while the tasks were being created leaves
    assert all(line.startswith(b'[["T",') for line in lines[1:5])
    journal.write_bytes(b"".join(lines[:4]) + lines[4][:17])
    before = ledgerflow.get_run(first.run_id, store=store).status()
    assert 0 < len(before.tasks) < 201
    assert {t.state for t in before.tasks.values()} <= {"pending", "ready"}
    run = ledgerflow.resume(first.run_id, store=store, executor="inline")
    assert run.state == "succeeded"
    assert run.result() == sum(range(200))
    view = ledgerflow.get_run(first.run_id, store=store).status()
    assert len(view.tasks) == 201
    assert {t.attempts for t in view.tasks.values()} == {1}


def test_the_journal_is_folded_in_the_background_while_a_task_runs(tmp_path) -> None:
    """The driver is busy inside a long task; the ledger file still catches up."""
    ledger = str(tmp_path / "l.duckdb")

    @task
    def long() -> str:
        me = context().run_id

        def running_in_file() -> bool:
            store = DuckDBStore(ledger)
            with store.ledger.connect(False) as con:   # the folded tables, no journal tail
                # "running" is committed before the task starts
                return con is not None and con.execute(
                    "SELECT state FROM tasks WHERE run_id = ?", [me]).fetchall() == [
                    ("running",)]

        wait_until(running_in_file, timeout=20, what="the background fold")
        return "seen"

    @pipeline
    def p():
        return long()

    run = p.run(store=DuckDBStore(ledger, policy=FoldPolicy(wake_bytes=1)), executor="inline")
    assert run.result() == "seen"


def _no_folds_of_earlier_tests() -> None:
    """Wait for what earlier tests' runs left this process doing with DuckDB (a fold
    behind a release holds memory of the one instance every ledger shares)."""
    for thread in threading.enumerate():
        if thread.name.startswith("ledgerflow-fold-behind-"):
            thread.join()


def test_a_fold_that_needs_more_memory_than_the_limit_retries_without_it(
        tmp_path, caplog) -> None:
    _no_folds_of_earlier_tests()
    caplog.set_level("INFO", logger="ledgerflow")
    disk = fan.run(n=3000, store=DuckDBStore(str(tmp_path / "l.duckdb"),
                                             policy=FoldPolicy(memory_limit="1MB")),
                   executor="inline").settle()
    mem = fan.run(n=3000, store=f"memory:{tmp_path}", executor="inline")
    assert any("retrying without the limit" in r.getMessage() for r in caplog.records)
    assert _rows(mem.status()) == _rows(disk.status())


def test_a_limit_the_instance_cannot_take_now_is_no_failed_fold(tmp_path, caplog,
                                                                 monkeypatch) -> None:
    """DuckDB refuses a memory limit below what its one instance holds (another fold
    of the process, of any ledger): the fold goes on under the limit it has."""
    from ledgerflow_stores.duckdb import fold

    def refused(con, name, value):
        if name == "memory_limit":
            raise fold.duckdb.OutOfMemoryException("could not free up enough memory")
    monkeypatch.setattr(fold, "instance_setting", refused)
    caplog.set_level("INFO", logger="ledgerflow")
    run = fan.run(n=20, store=str(tmp_path / "l.duckdb"), executor="inline").settle()
    assert run.state == "failed"        # (maybe[0] fails)
    assert any("folding under the limit it has" in r.getMessage() for r in caplog.records)
    import duckdb
    con = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    (rows,), = con.execute("SELECT count(*) FROM tasks WHERE run_id = ?", [run.run_id]).fetchall()
    con.close()
    assert rows == 21       # the tables hold the run: its fold was done


def test_a_bounded_fold_stops_between_batches_and_the_next_one_continues(
        tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "l.duckdb")
    monkeypatch.setattr(ledgerflow.runner, "COMMIT_RECORDS", 50)
    run = fan.run(n=400, store=_unfolded(path), executor="inline")
    monkeypatch.undo()
    store = DuckDBStore(path, policy=FoldPolicy(batch_bytes=20_000))
    (journal,) = (tmp_path / "l.duckdb.d" / "journals").glob("*.jsonl")
    size = journal.stat().st_size
    offsets = []
    while True:
        more = store.fold_run(run.run_id, max_bytes=30_000)
        with store.ledger.connect(False) as con:
            offsets.append(con.execute('SELECT "offset" FROM journal_folds').fetchall()[0][0])
        if not more:
            break
    assert len(offsets) > 3 and offsets == sorted(offsets) and offsets[-1] == size
    mem = fan.run(n=400, store=f"memory:{tmp_path}", executor="inline")
    assert _rows(mem.status()) == _rows(ledgerflow.get_run(run.run_id, store=path).status())


def test_a_reading_block_opens_the_ledger_once(tmp_path, monkeypatch) -> None:
    import duckdb

    from ledgerflow.store import reading
    from ledgerflow_stores.duckdb import connection

    path = str(tmp_path / "l.duckdb")
    run = fan.run(n=5, store=path, executor="inline").settle()
    st = DuckDBStore(path)
    opens: list[bool] = []
    real = connection.Ledger._open
    monkeypatch.setattr(connection.Ledger, "_open",
                        lambda self, write: opens.append(write) or real(self, write))
    with reading(st):
        assert st.get_run(run.run_id).state == "failed"
        assert st.approvals(run.run_id) == []
        assert st.notices(run.run_id) == []
        assert st.attempts(run.run_id)
    assert opens == [False]
    st.get_run(run.run_id)                     # outside the block: a connection a read
    assert opens == [False, False]
    duckdb.connect(path).close()               # the block let the file go


def test_a_write_inside_a_reading_block_reopens_for_the_reads_after_it(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    run = fan.run(n=5, store=path, executor="inline").settle()
    st = DuckDBStore(path)
    with st.reading():
        before = st.get_run(run.run_id, tasks=False)
        lease = st.take_over(run.run_id)        # a write: the kept read connection goes
        st.release(lease)
        after = st.get_run(run.run_id, tasks=False)
    assert (before.state, after.state) == ("failed", "failed")
    assert after.driver_alive is False


def test_a_ledger_path_with_a_quote_in_it(tmp_path) -> None:
    folder = tmp_path / "it's here"
    folder.mkdir()
    path = str(folder / "l.duckdb")
    run = fan.run(n=5, store=path, executor="inline")
    assert run.state == "failed"
    view = DuckDBStore(path).get_run(run.run_id)
    assert view.counts() == {"failed": 1, "succeeded": 4, "upstream_failed": 1}
    kept, _ = DuckDBStore(path).repair()        # attaches the old file by its path too
    assert kept and DuckDBStore(path).get_run(run.run_id).counts() == view.counts()


def test_a_resume_starts_its_progress_from_the_counts_the_run_had(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    run = fan.run(n=5, store=path, executor="inline")

    class Progress:
        begun: dict[str, int] | None = None

        def begin(self, counts: dict[str, int]) -> None:
            self.begun = dict(counts)

        def __call__(self, key: str, old: str, new: str) -> None:
            assert self.begun is not None, "a transition before begin()"

    progress = Progress()
    ledgerflow.resume(run.run_id, store=path, executor="inline", progress=progress)
    assert progress.begun == {"failed": 1, "succeeded": 4, "upstream_failed": 1}



@task
def shaky() -> int:
    raise ValueError("not yet")


@pipeline
def after_shaky():
    return total([shaky()])


def test_a_task_that_failed_with_a_reason_then_succeeded_folds_without_an_error(
        tmp_path) -> None:
    """One fold batch holding a task's move to ``failed`` with a reason and, after a
    reset, its ok attempt gives the error the journal's projection gives: none."""
    from ledgerflow.records import AttemptEnded, Transition
    path = tmp_path / "l.duckdb"
    first = after_shaky.run(store=_unfolded(path), executor="inline")
    assert first.state == "failed"
    assert first.status().tasks["total"].error      # the upstream failure, said why
    st = _unfolded(path)
    lease = st.take_over(first.run_id)
    seq = st.get_run(first.run_id).max_seq
    now = 1.0
    st.append(lease, [
        Transition(seq + 1, "total", 0, "upstream_failed", "failed", "given up: lost", now),
        Transition(seq + 2, "total", 0, "failed", "pending", "", now),
        Transition(seq + 3, "total", 0, "pending", "ready", "", now),
        Transition(seq + 4, "total", 1, "ready", "running", "attempt 1", now),
        AttemptEnded("total", 1, "ok", now, now, "", "", ""),
        Transition(seq + 5, "total", 1, "running", "succeeded", "", now)])
    st.release(lease)
    projected = st.get_run(first.run_id).tasks["total"]       # folded rows + journal
    assert projected.state == "succeeded" and projected.error is None
    DuckDBStore(str(path)).fold()
    folded = ledgerflow.get_run(first.run_id, store=str(path)).status().tasks["total"]
    assert not list((tmp_path / "l.duckdb.d" / "journals").glob("*.jsonl"))
    assert (folded.state, folded.error) == ("succeeded", None)


def test_a_drive_shorter_than_the_first_fold_is_folded_once_at_release(
        tmp_path, monkeypatch) -> None:
    """No background fold before ``first_fold`` seconds (it only slowed short runs)."""
    bites: list[int | None] = []
    real = DuckDBStore.fold_run

    def counted(self: DuckDBStore, run_id: str, *, max_bytes: int | None = None,
                archive_finished: bool = False, token: int | None = None,
                behind: bool = False) -> bool:
        bites.append(max_bytes)     # the background fold asks for a bite, release for all
        return real(self, run_id, max_bytes=max_bytes, archive_finished=archive_finished,
                    token=token, behind=behind)

    monkeypatch.setattr(DuckDBStore, "fold_run", counted)

    @task
    def one(i: int) -> int:
        return i

    @pipeline
    def many(n: int = 300):
        return [one(i) for i in range(n)]

    st = DuckDBStore(str(tmp_path / "l.duckdb"), policy=FoldPolicy(wake_bytes=1,
                                                                   start_after=60))
    assert st.policy.first_fold == 60
    assert many.run(store=st, executor="inline").settle().result() == list(range(300))
    assert bites == [None]                      # the release's fold, and no other
    assert FoldPolicy().first_fold == 1.0 and FoldPolicy(interval=0.1).first_fold == 0.1


def test_a_fold_setting_that_is_not_a_number_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv("LEDGERFLOW_FOLD_START_AFTER", "soon")
    with pytest.raises(ConfigError, match="LEDGERFLOW_FOLD_START_AFTER must be a number"):
        FoldPolicy.from_env()
    monkeypatch.setenv("LEDGERFLOW_FOLD_START_AFTER", "2.5")
    assert FoldPolicy.from_env().first_fold == 2.5


def test_outcome_records_fold_commit_by_commit_like_their_projection(tmp_path) -> None:
    """Each commit of format 3's outcome records folded in a batch of its own (a
    background fold's bites): a batch of only outcome records updates the tasks an
    earlier batch created, and an ok attempt there clears the error of a failed one."""
    import time

    from ledgerflow.projection import RunView, apply
    from ledgerflow.records import expand
    from ledgerflow.testing.stores import _compact_history, _same_view, run_records

    st = DuckDBStore(str(tmp_path / "l.duckdb"))
    now = time.time()
    first = run_records("r0", now)
    lease = st.create_run("r0", first)
    written = list(first)
    for commit in _compact_history(now):
        st.append(lease, commit)
        written += commit
        st.fold_run("r0")
        expected = apply(RunView("r0"), expand(written))
        _same_view(st.get_run("r0"), expected)
    st.release(lease)
    assert st.get_run("r0").tasks["a"].error is None
    assert [(a["task_key"], a["outcome"]) for a in st.attempts("r0")] == [
        ("a", "error"), ("a", "ok"), ("b", "ok")]
    assert [e["seq"] for e in st.events("r0")] == list(range(1, 12))


def _moves(run) -> list[tuple]:
    return [(e["seq"], e["task_key"], e["attempt"], e["from_state"], e["to_state"])
            for e in run.events()]


def test_a_plain_tasks_moves_live_in_its_row_and_read_as_events(tmp_path) -> None:
    """Schema 5: a new task's creation moves and its first success are kept in its row,
    and the ``events`` view reads every move as the memory store gives it (tasks that
    fail and retry, in ``fan``, too)."""
    import duckdb

    path = tmp_path / "l.duckdb"
    for pipe in (fan, wide):
        mem = pipe.run(n=6, store=f"memory:{tmp_path}-{pipe.name}", executor="inline")
        disk = pipe.run(n=6, store=str(path), executor="inline")
        assert _moves(disk) == _moves(mem) and len(_moves(disk)) > 20
    con = duckdb.connect(str(path), read_only=True)
    (rows,), (view,) = (con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?",
                                    [disk.run_id]).fetchone() for t in ("event_rows", "events"))
    (kept,) = con.execute("SELECT count(*) FROM tasks WHERE run_id = ? AND ok_seq IS NOT NULL",
                          [disk.run_id]).fetchone()
    con.close()
    # wide: 7 plain tasks' 28 moves; the rows hold the dispatches (and total's release)
    assert (view, kept) == (28, 7) and rows <= view / 3


@pipeline
def plain_fan(n: int):
    return total(one.map(list(range(n))))


@pytest.mark.parametrize("pipe", [wide, plain_fan], ids=["made-ready", "fan-out"])
@pytest.mark.parametrize("executor", ["inline", "threads"])
def test_a_dispatch_within_the_commit_lag_rides_in_its_success_and_lives_in_the_row(
        tmp_path, monkeypatch, pipe, executor) -> None:
    """Format 4 and schema 6: an in-driver attempt's dispatch that no commit wrote yet is
    carried by its success record, folded into the task's row and read back by
    ``events`` as the moves the memory store gives (tasks with retries never start
    before their start is committed: ``fan``'s fold through ``event_rows``). An executor
    outside the driver commits each dispatch before the attempt starts: the fold keeps
    that record's moves in the row just the same."""
    import duckdb

    monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", "3600")    # no commit is due meanwhile
    path = tmp_path / "l.duckdb"
    mem = pipe.run(n=6, store=f"memory:{tmp_path}", executor="inline")
    disk = pipe.run(n=6, store=str(path), executor=executor).settle()
    if executor == "inline":
        assert _moves(disk) == _moves(mem)
    else:       # (threads end in their own order)
        assert sorted(map(repr, (m[1:] for m in _moves(disk)))) == sorted(
            map(repr, (m[1:] for m in _moves(mem))))
    con = duckdb.connect(str(path), read_only=True)
    (rows,), (carried,) = (con.execute(sql, [disk.run_id]).fetchone() for sql in (
        "SELECT count(*) FROM event_rows WHERE run_id = ? AND to_state = 'running'",
        "SELECT count(*) FROM tasks WHERE run_id = ? AND ok_run_ts IS NOT NULL"))
    con.close()
    running = sum(1 for m in _moves(disk) if m[4] == "running")
    # each dispatch written once; in the driver, only the first may have been committed
    # on its own; a row keeps its task's dispatch in either case
    assert rows == 0 and carried == running, (rows, carried, running)


@pytest.mark.parametrize("history,taken_over_at", [
    ("_history", 3), ("_compact_history", None), ("_dispatch_history", 2)])
def test_the_results_and_attempts_tables_hold_every_one_recorded(
        tmp_path, history, taken_over_at) -> None:
    """Schema 6: ``results`` is a view of ``result_rows`` and the results task rows keep;
    a kept result that a later batch replaces (``a`` of the dispatch history runs again
    after a takeover) is written out first, so SQL reads every result recorded."""
    import duckdb

    from ledgerflow.records import AttemptEnded, ResultRecorded, expand
    from ledgerflow.testing import stores as contract

    st = DuckDBStore(str(tmp_path / "l.duckdb"))
    now = time.time()
    commits = getattr(contract, history)(now)
    written = expand(contract._written(st, commits, now, taken_over_at=taken_over_at))
    st.fold()
    st.settle()     # (the fold behind the release, which holds the file)
    con = duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True)
    results = con.execute("SELECT task_key, attempt, fingerprint, content_hash, kind, data, "
                          "uri, size, cached_from FROM results WHERE run_id = 'r0'").fetchall()
    attempts = con.execute("SELECT task_key, attempt, outcome FROM attempts "
                           "WHERE run_id = 'r0'").fetchall()
    con.close()
    assert sorted(results, key=repr) == sorted(
        ((r.task_key, r.attempt, r.fingerprint, r.content_hash, r.kind, r.data, r.uri, r.size,
          r.cached_from) for r in written if isinstance(r, ResultRecorded)), key=repr)
    assert sorted(attempts) == sorted((r.task_key, r.attempt, r.outcome) for r in written
                                      if isinstance(r, AttemptEnded))


@pytest.mark.parametrize("pipe", [wide, plain_fan, fan], ids=["made-ready", "fan-out",
                                                              "retrying"])
@pytest.mark.parametrize("executor", ["inline", "threads"])
def test_the_tables_read_as_the_projection_of_the_runs_own_journal(
        tmp_path, pipe, executor) -> None:
    """Whatever the fold keeps in a task's row and whatever it writes as rows, a run's
    moves and attempts (in the order written) and its task rows read back as the
    records of its own journal say."""
    import gzip

    from ledgerflow.projection import apply
    from ledgerflow.records import AttemptEnded, Transition, decode_line
    from ledgerflow.views import RunView
    from ledgerflow_stores.duckdb.journal import unframe

    path = str(tmp_path / "l.duckdb")
    run = pipe.run(n=12, store=path, executor=executor).settle()
    st = DuckDBStore(path)
    st.journals.settle()
    records = [r for _, seg in st.journals.archived(run.run_id)
               for line in gzip.decompress(seg.read_bytes()).splitlines()
               for r in decode_line(unframe(line) or b"")]
    assert [(e["seq"], e["task_key"], e["attempt"], e["from_state"], e["to_state"],
             e["reason"], e["ts"]) for e in run.events()] == [
        (r.seq, r.task_key, r.attempt, r.from_state, r.to_state, r.reason, r.ts)
        for r in records if isinstance(r, Transition)]
    assert [(a["task_key"], a["attempt"], a["outcome"], a["started_at"], a["ended_at"])
            for a in run.attempts()] == [
        (r.task_key, r.attempt, r.outcome, r.started_at, r.ended_at)
        for r in records if isinstance(r, AttemptEnded)]
    def timed(view):
        return {k: (*row, view.tasks[k].started_at, view.tasks[k].ended_at)
                for k, row in _rows(view).items()}
    assert timed(run.status()) == timed(apply(RunView(run.run_id), records))


def test_an_attempt_that_opens_a_batch_keeps_its_place_among_the_attempts(tmp_path) -> None:
    """Folded as each commit is written, an attempt record with no move before it in
    its batch is placed after the run's moves folded before, and reads in the order
    written."""
    from ledgerflow.records import AttemptEnded, expand
    from ledgerflow.testing import stores as contract

    st = _unfolded(tmp_path / "l.duckdb")
    now = time.time()
    commits = contract._history(now)
    assert type(commits[2][0]) is AttemptEnded      # a commit that opens with an attempt
    first = contract.run_records("r0", now)
    lease = st.create_run("r0", first)
    for records in commits[:3]:
        st.append(lease, records)
        st.fold_run("r0")                           # one batch a commit
    st.release(lease)
    written = expand([*first, *(r for c in commits[:3] for r in c)])
    assert [(a["task_key"], a["attempt"], a["outcome"]) for a in st.attempts("r0")] == [
        (r.task_key, r.attempt, r.outcome) for r in written if isinstance(r, AttemptEnded)]


def test_repair_copies_the_events_of_a_schema_4_file_into_event_rows(tmp_path) -> None:
    """A run folded by a release at schema version 4 whose journal is gone, in a file
    too damaged to upgrade (its version says 3): ``repair`` copies the run's rows from
    the old file, its ``events`` into ``event_rows`` and its ``results`` into
    ``result_rows``."""
    import duckdb

    from ledgerflow_stores.duckdb import schema

    path = tmp_path / "l.duckdb"
    run = fan.run(n=6, store=str(path), executor="inline").settle()
    before = _moves(run)
    con = duckdb.connect(str(path))     # as schema 4 wrote it: every move a row
    results = sorted(con.execute("SELECT task_key, attempt, content_hash FROM results").fetchall())
    for table in ("events", "results", "attempts"):
        con.execute(f"CREATE TABLE old_{table} AS SELECT * FROM {table}")
        con.execute(f"DROP VIEW {table}")
        con.execute(f"DROP TABLE {table.removesuffix('s')}_rows")
        con.execute(f"ALTER TABLE old_{table} RENAME TO {table}")
    for col in schema.DERIVED_COLUMNS:
        con.execute(f"ALTER TABLE tasks DROP COLUMN {col.split()[0]}")
    con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    con.close()
    for journal in (tmp_path / "l.duckdb.d" / "journals").iterdir():
        journal.unlink()        # folded long ago: only the old file holds the run
    _, notes = DuckDBStore(str(path)).repair()
    assert any("without a journal copied" in n for n in notes), notes
    assert _moves(ledgerflow.get_run(run.run_id, store=str(path))) == before
    con = duckdb.connect(str(path), read_only=True)
    assert sorted(con.execute("SELECT task_key, attempt, content_hash FROM results")
                  .fetchall()) == results and len(results) == 5     # maybe[0] fails
    con.close()


def test_a_runs_first_batch_that_finds_its_row_updates_it(tmp_path) -> None:
    """The batch that defines a run writes the run's row; if the row is there already
    (written by an earlier fold of that batch), the batch updates it and the tasks it
    names, like any later batch."""
    import duckdb

    path = tmp_path / "l.duckdb"
    wide.run(n=1, store=str(path), executor="inline")       # the ledger's tables
    run = wide.run(n=3, store=_unfolded(path), executor="inline")
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO runs (run_id, state, max_seq) VALUES (?, 'running', 0)",
                [run.run_id])
    con.close()
    DuckDBStore(str(path)).fold()
    con = duckdb.connect(str(path), read_only=True)
    (state, max_seq), = con.execute("SELECT state, max_seq FROM runs WHERE run_id = ?",
                                    [run.run_id]).fetchall()
    tasks = dict(con.execute("SELECT task_key, state FROM tasks WHERE run_id = ?",
                             [run.run_id]).fetchall())
    con.close()
    assert (state, max_seq) == ("succeeded", len(_moves(run)))
    assert set(tasks.values()) == {"succeeded"} and len(tasks) == 4
