"""The ``processes`` executor: no fork of the driver, ask first then kill, by-value shipping."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ledgerflow import context, pipeline, task
from ledgerflow.control import load_module
from ledgerflow.programs import descendants
from tests.waiting import wait_until


def _mine() -> set[int]:
    """Live processes below this one (the test process drives the runs)."""
    return set(descendants(os.getpid()))


def _pids(folder: Path) -> set[int]:
    return {int(f.name.split("-")[-1]) for f in folder.iterdir() if f.name.startswith("pid-")}


def test_the_driver_never_forks(ledger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers come from a forkserver: os.fork is never called in the threaded driver."""
    def no_fork() -> int:
        raise AssertionError("the driver forked")

    monkeypatch.setattr(os, "fork", no_fork)

    @task
    def where(i: int) -> int:
        return os.getpid()

    @pipeline
    def p():
        return where.map([1, 2, 3, 4])

    pids = p.run(store=ledger, executor="processes", workers=2).result()
    assert os.getpid() not in pids and len(set(pids)) >= 1


def test_a_timed_out_attempt_is_asked_to_stop_and_its_late_result_rejected(
        tmp_path: Path, ledger: str) -> None:
    @task(timeout=0.3)
    def polite(path: str) -> str:
        while not context().cancel_requested:
            time.sleep(0.01)
        Path(path).write_text("asked to stop")
        return "late"

    @task
    def keep_alive() -> None:
        time.sleep(1.5)

    @pipeline
    def p():
        return polite(str(tmp_path / "asked")), keep_alive()

    run = p.run(store=ledger, executor="processes", workers=2)
    assert run.status().tasks["polite"].state == "failed"
    assert [a["outcome"] for a in run.attempts("polite")] == ["timeout"]
    assert (tmp_path / "asked").read_text() == "asked to stop"   # it saw the request
    assert [n["kind"] for n in run.notices()] == ["late_result_rejected"]


def test_a_cancel_that_is_ignored_kills_the_worker_then_confirms(
        tmp_path: Path, ledger: str) -> None:
    @task
    def deaf(folder: str) -> None:
        Path(folder, f"pid-{os.getpid()}").touch()
        time.sleep(60)                  # never looks at cancel_requested

    @pipeline
    def p():
        return deaf(str(tmp_path))

    run = p.run(store=ledger, executor="processes", wait=False)
    wait_until(lambda: _pids(tmp_path), what="the task to start")
    run.cancel()
    assert run.wait(timeout=30) == "cancelled"
    assert run.status().tasks["deaf"].state == "cancelled"
    assert not _pids(tmp_path) & _mine()        # confirmed only once the worker was gone


FLOW = '''
import os
from ledgerflow import pipeline, task

OFFSET = 100

def helper(x):
    return x + OFFSET

class Box:
    def __init__(self, v):
        self.v = v

@task
def boxed(x: int) -> int:
    return Box(helper(x)).v + 0 * os.getpid()

@pipeline
def flow(n: int = 3):
    return boxed.map(list(range(n)))
'''


def test_tasks_of_a_pipeline_file_loaded_by_path_run_on_processes(write_flow, ledger: str
                                                                  ) -> None:
    """The forkserver cannot import such a file by name: it is shipped by value."""
    module = load_module(write_flow(FLOW, name="flow_by_path_xyz.py"))
    run = module.flow.run(store=ledger, executor="processes", workers=2)
    assert run.result() == [100, 101, 102]


def test_workers_see_the_driver_environment_and_directory(
        tmp_path: Path, ledger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LF_PROCESSES_PROBE", "set after the forkserver started")
    monkeypatch.chdir(tmp_path)

    @task
    def probe() -> tuple[str, str]:
        return os.environ.get("LF_PROCESSES_PROBE", ""), os.getcwd()

    @pipeline
    def p():
        return probe()

    got = p.run(store=ledger, executor="processes").result()
    assert list(got) == ["set after the forkserver started", str(tmp_path)]
