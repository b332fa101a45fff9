"""The seed's validation table, through the real scheduler and runner."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import NonRetryableError, context, pipeline, task
from ledgerflow_executors.mock import MockExecutor
from tests.waiting import wait_until


def _log(path: Path, name: str, event: str) -> None:
    with open(path, "a") as fh:
        fh.write(f"{time.monotonic():.6f} {name} {event}\n")


def _events(path: Path) -> list[tuple[float, str, str]]:
    out = []
    for line in path.read_text().splitlines():
        t, name, event = line.split()
        out.append((float(t), name, event))
    return out


@task
def step(log: str, name: str, delay: float = 0.0, *deps: object) -> str:
    _log(Path(log), name, "start")
    time.sleep(delay)
    _log(Path(log), name, "end")
    return name


@task
def meet(log: str, name: str, other: str, *deps: object) -> str:
    """Start, then wait (up to 30 s) until ``other`` started too: ends only if both ran
    at once."""
    _log(Path(log), name, "start")
    end = time.monotonic() + 30
    while time.monotonic() < end and f" {other} start" not in Path(log).read_text():
        time.sleep(0.01)
    _log(Path(log), name, "end")
    return name


def _states(run: ledgerflow.Run) -> dict[str, tuple[str, int]]:
    return {t.key: (t.state, t.attempts) for t in run.status().tasks.values()}


EXECUTORS = ["mock", "threads", "processes"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_chain_runs_in_order(tmp_path: Path, ledger: str, executor: str) -> None:
    log = str(tmp_path / "log")

    @pipeline
    def chain():
        a = step(log, "A")
        b = step(log, "B", 0.0, a)
        return step(log, "C", 0.0, b)

    run = chain.run(store=ledger, executor=MockExecutor() if executor == "mock" else executor)
    assert run.state == "succeeded"
    names = [n for _, n, e in _events(Path(log)) if e == "start"]
    assert names == ["A", "B", "C"]
    assert run.result() == "C"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_diamond_runs_branches_concurrently(tmp_path: Path, ledger: str, executor: str) -> None:
    log = str(tmp_path / "log")

    @pipeline
    def diamond():
        a = step(log, "A")
        b = meet(log, "B", "C", a)
        c = meet(log, "C", "B", a)
        return step(log, "D", 0.0, b, c)

    run = diamond.run(store=ledger, workers=2,
                      executor=MockExecutor() if executor == "mock" else executor)
    assert run.state == "succeeded"
    ev = {(n, e): t for t, n, e in _events(Path(log))}
    # B and C overlap; D starts after both ended
    assert ev[("B", "start")] < ev[("C", "end")] and ev[("C", "start")] < ev[("B", "end")]
    assert ev[("D", "start")] > max(ev[("B", "end")], ev[("C", "end")])


@task(retries=3)
def flaky(counter: str) -> int:
    p = Path(counter)
    n = int(p.read_text()) if p.exists() else 0
    p.write_text(str(n + 1))
    if n < 2:
        raise RuntimeError(f"transient {n}")
    return n


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fails_twice_then_succeeds_with_three_attempts(tmp_path: Path, ledger: str,
                                                        executor: str) -> None:
    @pipeline
    def p():
        return flaky(str(tmp_path / "count"))

    run = p.run(store=ledger, executor=MockExecutor() if executor == "mock" else executor)
    assert run.state == "succeeded"
    assert _states(run)["flaky"] == ("succeeded", 3)
    outcomes = [a["outcome"] for a in run.attempts("flaky")]
    assert outcomes == ["error", "error", "ok"]


@task(retries=5)
def refuse() -> None:
    raise NonRetryableError("bad credentials")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_non_retryable_error_stops_at_once_and_downstream_never_starts(
        tmp_path: Path, ledger: str, executor: str) -> None:
    log = str(tmp_path / "log")

    @pipeline
    def p():
        bad = refuse()
        step(log, "after", 0.0, bad)
        return step(log, "independent")

    run = p.run(store=ledger, executor=MockExecutor() if executor == "mock" else executor)
    st = _states(run)
    assert run.state == "failed"
    assert st["refuse"] == ("failed", 1)
    assert st["step"] == ("upstream_failed", 0)
    assert st["step-2"] == ("succeeded", 1)        # the independent branch kept running
    assert [n for _, n, _ in _events(Path(log))] == ["independent", "independent"]


def test_retries_are_bounded(ledger: str) -> None:
    @task(retries=2, retry_delay=0.01, backoff=2.0, jitter=0.5)
    def always() -> None:
        raise RuntimeError("nope")

    @pipeline
    def p():
        return always()

    run = p.run(store=ledger, executor=MockExecutor())
    assert _states(run)["always"] == ("failed", 3)


def test_retry_on_limits_what_is_retried(ledger: str) -> None:
    @task(retries=3, retry_on=ConnectionError)
    def wrong_kind() -> None:
        raise ValueError("not a connection problem")

    @pipeline
    def p():
        return wrong_kind()

    run = p.run(store=ledger, executor="inline")
    assert _states(run)["wrong_kind"] == ("failed", 1)


def test_retry_delay_backoff_and_jitter() -> None:
    opts = task(retry_delay=1.0, backoff=2.0, jitter=0.5)(lambda: None).options
    assert opts.delay(1, 0.5) == pytest.approx(1.0)
    assert opts.delay(3, 0.5) == pytest.approx(4.0)
    assert opts.delay(1, 0.0) == pytest.approx(0.5) and opts.delay(1, 1.0) == pytest.approx(1.5)


def test_timeout_does_not_unlock_downstream_and_late_result_is_rejected(
        tmp_path: Path, ledger: str) -> None:
    log = str(tmp_path / "log")

    @task(timeout=0.2)
    def slow() -> int:
        return 1

    @pipeline
    def p():
        s = slow()
        step(log, "downstream", 0.0, s)
        return step(log, "keeps_run_alive", 1.0)

    mock = MockExecutor({"slow": {"late": 0.5}})
    run = p.run(store=ledger, executor=mock, workers=2)
    st = _states(run)
    assert st["slow"] == ("failed", 1)
    assert st["step"] == ("upstream_failed", 0)
    assert [a["outcome"] for a in run.attempts("slow")] == ["timeout"]
    kinds = [n["kind"] for n in run.notices()]
    assert kinds == ["late_result_rejected"]
    assert "downstream" not in Path(log).read_text()


def test_processes_executor_kills_a_timed_out_attempt(tmp_path: Path, ledger: str) -> None:
    from ledgerflow.programs import descendants

    @task(timeout=0.3, retries=1)
    def sleepy(folder: str) -> None:
        Path(folder, str(os.getpid())).touch()     # ignores cancel_requested
        time.sleep(30)

    @pipeline
    def p():
        return sleepy(str(tmp_path))

    run = p.run(store=ledger, executor="processes")
    assert _states(run)["sleepy"] == ("failed", 2)
    pids = {int(f.name) for f in tmp_path.iterdir() if f.name.isdigit()}
    assert len(pids) == 2                           # each attempt had its own worker...
    assert not pids & set(descendants(os.getpid()))  # ...and both were killed


def test_mock_success_reported_twice_is_applied_once(ledger: str) -> None:
    @task
    def once() -> int:
        return 7

    @pipeline
    def p():
        a = once()
        return step("/dev/null", "x", 0.3, a)

    run = p.run(store=ledger, executor=MockExecutor({"once": {"twice": True}}))
    assert run.state == "succeeded"
    assert _states(run)["once"] == ("succeeded", 1)
    assert [n["kind"] for n in run.notices()] == ["duplicate_result_rejected"]


@pytest.mark.parametrize("executor", ["mock", "threads", "processes"])
def test_cancel_starts_nothing_new_and_waits_for_confirmation(tmp_path: Path, ledger: str,
                                                              executor: str) -> None:
    log = str(tmp_path / "log")

    @task
    def wait_for_cancel(path: str) -> str:
        _log(Path(path), "hang", "start")
        while not context().cancel_requested:
            time.sleep(0.01)
        context().raise_if_cancelled()
        return "unreachable"

    @pipeline
    def p():
        h = wait_for_cancel(log)
        return step(log, "never", 0.0, h)

    ex = MockExecutor({"wait_for_cancel": {"hang": True}}) if executor == "mock" else executor
    run = p.run(store=ledger, executor=ex, wait=False)
    wait_until(lambda: _states(run).get("wait_for_cancel", ("",))[0] == "running",
               what="the task to run")
    run.cancel()
    assert run.wait(timeout=20) == "cancelled"
    st = _states(run)
    assert st["wait_for_cancel"][0] == "cancelled"
    assert st["step"][0] == "cancelled"
    events = [e for e in _events_of(run, "wait_for_cancel")]
    assert events[-2:] == [("running", "cancelling"), ("cancelling", "cancelled")]
    if Path(log).exists():
        assert "never" not in Path(log).read_text()


def _events_of(run: ledgerflow.Run, key: str) -> list[tuple[str, str]]:
    store = run.settle().store      # (its tables read as SQL)
    with store.ledger.connect(False) as con:   # the ledger's own event log
        assert con is not None
        rows = con.execute("SELECT from_state, to_state FROM events WHERE run_id = ? AND "
                           "task_key = ? ORDER BY seq", [run.run_id, key]).fetchall()
    return [(a, b) for a, b in rows]


def test_fail_fast_stops_dispatching(tmp_path: Path, ledger: str) -> None:
    log = str(tmp_path / "log")

    @pipeline
    def p():
        refuse()
        return [step(log, f"s{i}", 0.05) for i in range(20)]

    run = p.run(store=ledger, executor="threads", workers=1, fail_fast=True)
    assert run.state == "failed"
    counts = run.status().counts()
    assert counts.get("cancelled", 0) > 0


def test_context_inside_a_task(ledger: str) -> None:
    seen: list[tuple[str, str, int, str]] = []
    lock = threading.Lock()

    @task(retries=1)
    def who() -> None:
        ctx = context()
        with lock:
            seen.append((ctx.run_id, ctx.task_key, ctx.attempt, ctx.idempotency_key))
        if ctx.attempt == 1:
            raise RuntimeError("again")

    @pipeline
    def p():
        return who()

    run = p.run(store=ledger, executor="threads")
    assert [s[2] for s in seen] == [1, 2]
    assert seen[0][0] == run.run_id and seen[0][1] == "who"
    assert seen[0][3] == seen[1][3]               # stable across attempts


def test_durable_before_unlock(ledger: str) -> None:
    """A dependent starts only after its upstream's success is readable from the ledger."""

    @task
    def first() -> int:
        return 1

    @task
    def check(x: int, i: int) -> str:
        view = ledgerflow.get_run(context().run_id, store=ledger).status()
        return view.tasks["first" if i == 0 else f"first-{i + 1}"].state

    @pipeline
    def p():
        return [check(first(), i) for i in range(30)]

    run = p.run(store=ledger, executor="threads", workers=4)
    assert run.result() == ["succeeded"] * 30


def test_durable_before_unlock_under_bounded_group_commits(ledger: str, monkeypatch) -> None:
    """Group commits flushed every few records mid-loop, inline (no thread hand-off
    to hide a race): still no task with side effects runs before its upstream's
    success is readable from the ledger (the commit lag never applies to it)."""
    import ledgerflow.runner
    from ledgerflow_stores.duckdb import DuckDBStore
    monkeypatch.setattr(ledgerflow.runner, "COMMIT_RECORDS", 7)
    appends: list[int] = []
    original = DuckDBStore.append

    def counting(self, lease, records):
        appends.append(len(records))
        original(self, lease, records)

    monkeypatch.setattr(DuckDBStore, "append", counting)

    @task
    def first(i: int) -> int:
        return i

    @task(side_effects=True)
    def step(upstream: str | None) -> str:
        if upstream is not None:
            view = ledgerflow.get_run(context().run_id, store=ledger).status()
            assert view.tasks[upstream].state == "succeeded", view.tasks[upstream].state
        return context().task_key

    @pipeline
    def p():
        x = step(None)
        for _ in range(30):
            x = step(x)
        return first.map(list(range(60))), x

    run = p.run(store=ledger, executor="inline")
    assert run.state == "succeeded", [t.error for t in run.status().tasks.values() if t.error]
    assert len(appends) > 30        # the fan-out's records went out in small groups


def test_inline_timeout_is_detected_when_the_attempt_returns(ledger: str) -> None:
    @task(timeout=0.1, retries=1)
    def overrun() -> int:
        time.sleep(0.25)
        return 1

    @pipeline
    def p():
        return overrun()

    run = p.run(store=ledger, executor="inline")
    assert _states(run)["overrun"] == ("failed", 2)
    assert [a["outcome"] for a in run.attempts("overrun")] == ["timeout", "timeout"]
    assert [n["kind"] for n in run.notices()] == ["late_result_rejected"] * 2


def test_a_lone_task_runs_in_the_driver_thread_on_threads(ledger: str) -> None:
    """A chain on ``threads`` skips the hand-off; tasks with a timeout still use the pool."""
    import threading
    seen: dict[str, bool] = {}

    @task
    def lone() -> int:
        seen["lone"] = threading.current_thread() is threading.main_thread()
        return 1

    @task(timeout=5)
    def guarded(x: int) -> int:
        seen["guarded"] = threading.current_thread() is threading.main_thread()
        return x

    @pipeline
    def p():
        return guarded(lone())

    assert p.run(store=ledger, executor="threads").result() == 1
    assert seen == {"lone": True, "guarded": False}


def test_an_unconfirmed_cancel_is_left_cancelling_with_a_notice(
        ledger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGERFLOW_CANCEL_GRACE", "0.3")

    @task
    def deaf() -> int:
        return 1

    @pipeline
    def p():
        return deaf()

    run = p.run(store=ledger, executor=MockExecutor({"deaf": {"late": 3}}), wait=False)
    wait_until(lambda: _states(run).get("deaf", ("",))[0] == "running", what="the task to run")
    run.cancel()
    assert run.wait(timeout=20) == "cancelled"
    assert _states(run)["deaf"][0] == "cancelling"      # never claimed stopped
    assert [n["kind"] for n in run.notices()] == ["cancel_unconfirmed"]


def test_a_worker_process_that_dies_loses_its_attempt(ledger: str, tmp_path: Path) -> None:
    @task(retries=1)
    def crash(marker: str) -> str:
        if not Path(marker).exists():
            Path(marker).touch()
            os._exit(1)            # the worker process dies mid-attempt
        return "second attempt"

    @pipeline
    def p():
        return crash(str(tmp_path / "crashed-once"))

    run = p.run(store=ledger, executor="processes")
    assert run.result() == "second attempt"
    assert [a["outcome"] for a in run.attempts("crash")] == ["lost", "ok"]


def test_gc_settings_come_back_after_overlapping_runs() -> None:
    import gc

    from ledgerflow._gc import quiet_gc
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    a, b = quiet_gc(), quiet_gc()
    a.__enter__()
    b.__enter__()
    assert gc.get_threshold()[0] >= 20_000
    a.__exit__(None, None, None)        # the first run ends while the second goes on
    assert gc.get_threshold()[0] >= 20_000 and gc.get_freeze_count() > 0
    b.__exit__(None, None, None)
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen == 0


def test_a_run_leaves_the_gc_as_it_found_it(ledger: str) -> None:
    import gc

    @task
    def one() -> int:
        return 1

    @pipeline
    def p():
        return one()

    before = gc.get_threshold()
    assert p.run(store=ledger, executor="inline").result() == 1
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_objects_the_program_froze_stay_frozen() -> None:
    import gc

    from ledgerflow._gc import quiet_gc
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with quiet_gc():
            pass
        # not unfrozen (a frozen object may still be freed by its refcount meanwhile)
        assert gc.get_freeze_count() > frozen - 100
    finally:
        gc.unfreeze()


@task
def tick(i: int) -> int:
    time.sleep(0.01)
    return i


@pipeline
def ticks(n: int = 300):
    return tick.map(list(range(n)))


def test_cancel_is_honoured_between_tasks_on_inline(ledger: str) -> None:
    run = ticks.run(store=ledger, executor="inline", wait=False)
    wait_until(lambda: run.status().counts().get("succeeded", 0) >= 20, what="20 tasks")
    ledgerflow.cancel(run.run_id, store=ledger)        # as another process would
    assert run.wait(timeout=30) == "cancelled"
    counts = run.status().counts()
    assert counts.get("succeeded", 0) < 150, counts
    assert counts["cancelled"] == 300 - counts.get("succeeded", 0)
