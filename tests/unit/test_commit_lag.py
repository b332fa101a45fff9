"""The commit lag: which in-driver attempts may start before their start is committed.

Each task of a chain reads the ledger (from the task, as another process would)
to see whether its upstream's success was committed before it started. With a
lag longer than the run, plain inline tasks start ahead of their commits; tasks
with side effects or retries, a lag of 0, a resume and an executor outside the
driver never do.
"""

from __future__ import annotations

import os
import threading

import pytest

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow.errors import ConfigError
from tests.waiting import wait_until

SEEN: list[str] = []        # per task after the first: its upstream's state in the ledger


def _upstream_state(upstream: str | None) -> None:
    if upstream is not None:
        view = ledgerflow.get_run(context().run_id, store=os.environ["LAG_LEDGER"]).status()
        SEEN.append(view.tasks[upstream].state if upstream in view.tasks else "unseen")
    if os.environ.get("LAG_FAIL") == context().task_key:
        raise RuntimeError("failing once, as asked")


@task
def plain(upstream: str | None) -> str:
    _upstream_state(upstream)
    return context().task_key


@task(side_effects=True)
def effect(upstream: str | None) -> str:
    _upstream_state(upstream)
    return context().task_key


@task(retries=1)
def retried(upstream: str | None) -> str:
    _upstream_state(upstream)
    return context().task_key


def _chain(step: object, n: int = 12):
    @pipeline
    def chain():
        x = step(None)  # type: ignore[operator]
        for _ in range(n - 1):
            x = step(x)  # type: ignore[operator]
        return x
    return chain


@pytest.fixture()
def lag(ledger: str, monkeypatch: pytest.MonkeyPatch):
    """Run with the given commit lag (seconds); returns the states the tasks saw."""
    monkeypatch.setenv("LAG_LEDGER", ledger)
    SEEN.clear()

    def set_lag(seconds: str) -> list[str]:
        monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", seconds)
        return SEEN
    return set_lag


def test_plain_inline_tasks_start_within_the_lag_and_their_results_land(ledger: str,
                                                                        lag) -> None:
    seen = lag("3600")
    run = _chain(plain).run(store=ledger, executor="inline")
    assert run.state == "succeeded"
    assert len(seen) == 11 and "succeeded" not in seen      # each started ahead of it
    assert {t.state for t in run.status().tasks.values()} == {"succeeded"}
    assert all(t.attempts == 1 for t in run.status().tasks.values())


@pytest.mark.parametrize("step", [effect, retried], ids=["side_effects", "retries"])
def test_tasks_that_must_not_lag_see_their_upstream_committed(ledger: str, lag,
                                                              step: object) -> None:
    seen = lag("3600")
    run = _chain(step).run(store=ledger, executor="inline")
    assert run.state == "succeeded"
    assert seen == ["succeeded"] * 11


def test_a_lag_of_zero_commits_every_start_first(ledger: str, lag) -> None:
    seen = lag("0")
    assert _chain(plain).run(store=ledger, executor="inline").state == "succeeded"
    assert seen == ["succeeded"] * 11


def test_an_executor_outside_the_driver_never_lags(ledger: str, lag) -> None:
    seen = lag("3600")
    assert _chain(plain).run(store=ledger, executor="threads").state == "succeeded"
    assert seen == ["succeeded"] * 11


def test_a_resume_commits_every_start_first(ledger: str, lag,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen = lag("3600")
    monkeypatch.setenv("LAG_FAIL", "plain-5")
    chain = _chain(plain)
    first = chain.run(store=ledger, executor="inline")
    assert first.state == "failed"
    monkeypatch.delenv("LAG_FAIL")
    seen.clear()
    again = ledgerflow.resume(first.run_id, store=ledger, executor="inline", pipeline=chain)
    assert again.state == "succeeded"
    assert seen == ["succeeded"] * 8     # plain-5 to plain-12 (keys: plain, plain-2, ...)


def test_a_negative_lag_is_refused_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerflow.config import Settings
    monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", "-1")
    with pytest.raises(ConfigError, match="commit_lag must be 0 or more") as err:
        Settings.from_env()
    assert "commit_lag=0" in (err.value.hint or "")
    monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", "soon")
    with pytest.raises(ConfigError, match="LEDGERFLOW_COMMIT_LAG must be a number"):
        Settings.from_env()


@task
def quick(i: int) -> int:
    return i


def _ends_long(last: object):
    """Five quick tasks, then ``last``: a long attempt started within the lag."""
    @pipeline
    def ends_long():
        x = quick(0)
        for i in range(1, 5):
            x = quick(i)
        return last(x)  # type: ignore[operator]
    return ends_long


@task
def waits_to_be_seen(upstream: int) -> str:
    """Waits until the ledger shows this attempt running after its upstream's success."""
    def seen() -> bool:
        view = ledgerflow.get_run(context().run_id, store=os.environ["LAG_LEDGER"]).status()
        me, up = view.tasks.get(context().task_key), view.tasks.get("quick-5")
        return (me is not None and me.state == "running" and up is not None
                and up.state == "succeeded")
    wait_until(seen, what="the attempt committed while it runs", every=0.05)
    return "seen"


def test_a_long_attempt_started_within_the_lag_is_committed_while_it_runs(ledger: str,
                                                                           lag) -> None:
    lag("0.2")
    run = _ends_long(waits_to_be_seen).run(store=ledger, executor="inline")
    assert run.result() == "seen"


def test_settings_built_directly_refuse_a_negative_lag_too() -> None:
    from ledgerflow.config import Settings
    for bad in (-0.5, float("nan")):
        with pytest.raises(ConfigError, match="commit_lag must be 0 or more"):
            Settings(commit_lag=bad)
    assert Settings(commit_lag=0).commit_lag == 0


REFUSED = threading.Event()


@task
def waits_for_the_refused_write(upstream: int) -> str:
    wait_until(REFUSED.is_set, what="the lagged commit's write, refused")
    return "done"


def test_a_lagged_commit_that_cannot_be_written_stops_the_drive_and_resumes(
        ledger: str, lag, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit thread's write fails (a full disk): the driver raises it at its next
    flush; nothing is lost that was written, and a resume finishes the run."""
    from ledgerflow_stores.duckdb.store import DuckDBStore
    lag("0.05")
    REFUSED.clear()
    real = DuckDBStore.append

    def append(self: DuckDBStore, lease, records) -> None:
        if threading.current_thread().name.startswith("ledgerflow-commit-"):
            REFUSED.set()
            raise OSError(28, "No space left on device")
        real(self, lease, records)

    monkeypatch.setattr(DuckDBStore, "append", append)
    ends_long = _ends_long(waits_for_the_refused_write)
    with pytest.raises(OSError, match="No space left"):
        ends_long.run(store=ledger, executor="inline")
    monkeypatch.setattr(DuckDBStore, "append", real)
    (view,) = ledgerflow.runs(store=ledger)
    again = ledgerflow.resume(view.run_id, store=ledger, executor="inline", pipeline=ends_long)
    assert again.state == "succeeded" and again.result() == "done"
    assert {t.state for t in again.status().tasks.values()} == {"succeeded"}
