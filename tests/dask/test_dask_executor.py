"""The dask executor on real clusters: fan-out, worker loss, timeouts, cancel, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerflow as lf
from ledgerflow import NonRetryableError, context, pipeline, task
from ledgerflow.config import Settings
from ledgerflow.control import make_executor
from ledgerflow.errors import ConfigError
from ledgerflow_dask import DaskExecutor

pytestmark = [
    pytest.mark.dask,
    pytest.mark.timeout(120),
]


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``cond`` until it holds or fail the test."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or cond}")


# -- tasks and pipelines (self-contained bodies: they are shipped by value) ------------

@task
def square(x: int) -> int:
    return x * x


@task
def add_up(xs: list[int]) -> int:
    return sum(xs)


@pipeline
def fan(n: int = 200):
    return add_up(square.map(list(range(n))))


@task(retries=2)
def slow_mark(i: int, folder: str) -> int:
    Path(folder, f"{i}-{context().attempt}-{os.getpid()}").touch()
    # long enough on the first attempt that a worker killed right after the mark
    # appears is always killed mid-task, even on a loaded machine
    time.sleep(1.5 if context().attempt == 1 else 0.05)
    return i


@pipeline
def slow_fan(folder: str, n: int = 10):
    return slow_mark.map(list(range(n)), folder=folder)


@task(timeout=1.0, retries=1)
def stubborn() -> str:
    if context().attempt == 1:
        time.sleep(2.0)          # ignores cancel_requested: its result comes late
        return "late"
    return "on time"


@task
def long_neighbour() -> str:
    time.sleep(1.5)              # keeps the run going until the late result arrives
    return "done"


@pipeline
def with_timeout():
    first = stubborn()
    return [first, long_neighbour(after=[first])]


@task
def polite(i: int, folder: str) -> int:
    end = time.monotonic() + 20
    while time.monotonic() < end:
        if context().cancel_requested:
            Path(folder, f"saw-cancel-{i}").touch()
            context().raise_if_cancelled()
        time.sleep(0.02)
    return i


@pipeline
def polite_fan(folder: str, n: int = 8):
    return polite.map(list(range(n)), folder=folder)


class Fussy(Exception):
    """A user exception type (travels back by value and keeps its identity)."""


@task(retries=3, retry_on=Fussy)
def flaky(folder: str) -> str:
    marks = Path(folder)
    n = len(list(marks.glob("flaky-*")))
    (marks / f"flaky-{n}").touch()
    if n < 2:
        raise Fussy(f"try {n}")
    return f"ok after {n}"


@task(retries=3)
def refuses() -> None:
    raise NonRetryableError("no")


@task
def big(payload: bytes) -> int:
    return len(payload)


@pipeline
def mixed(folder: str):
    return [flaky(folder), refuses(), big(b"x" * (2 << 20))]


# -- the tests ----------------------------------------------------------------------------

def test_plugin_builds_the_executor() -> None:
    ex = make_executor("dask", Settings(workers=2, options={"dask_cancel_grace": "0.5"}))
    assert isinstance(ex, DaskExecutor)
    assert ex.address is None and ex.cancel_grace == 0.5


def test_queue_ahead_option() -> None:
    ex = make_executor("dask", Settings(workers=2, options={"dask_queue_ahead": "5"}))
    assert isinstance(ex, DaskExecutor) and ex._queue_ahead == 5
    with pytest.raises(ConfigError, match="dask_queue_ahead must be a whole number"):
        make_executor("dask", Settings(workers=2, options={"dask_queue_ahead": "lots"}))


def test_jobs_queue_ahead_of_the_workers_by_default(store: str, shared_client: Any) -> None:
    ex = DaskExecutor(client=shared_client)
    run = fan.run(n=50, executor=ex, store=store, workers=2)
    assert run.state == "succeeded"
    assert run.result() == sum(i * i for i in range(50))
    threads = sum(shared_client.nthreads().values())
    assert ex.queue_ahead == 64 * threads


def test_fan_out_of_200_on_its_own_local_cluster(store: str) -> None:
    ex = DaskExecutor()
    run = fan.run(n=200, executor=ex, store=store, workers=2)
    assert run.state == "succeeded"
    assert run.result() == sum(i * i for i in range(200))
    assert len(run.tasks()) == 201
    assert ex.cluster is None and ex.client is None       # closed at shutdown


def test_errors_retries_and_large_payloads(store: str, tmp_path: Path,
                                           shared_client: Any) -> None:
    run = mixed.run(folder=str(tmp_path), executor=DaskExecutor(client=shared_client),
                    store=store, workers=2)
    assert run.state == "failed"
    by_key = {t["key"]: t for t in run.tasks()}
    flaky_row = next(t for k, t in by_key.items() if k.startswith("flaky"))
    assert flaky_row["state"] == "succeeded" and flaky_row["attempts"] == 3
    refuses_row = next(t for k, t in by_key.items() if k.startswith("refuses"))
    assert refuses_row["state"] == "failed" and refuses_row["attempts"] == 1
    big_key = next(k for k in by_key if k.startswith("big"))
    assert run.result(big_key) == 2 << 20


def test_killed_worker_is_lost_and_retried(store: str, tmp_path: Path) -> None:
    ex = DaskExecutor()
    marks = tmp_path / "marks"       # apart from the ledger's own files
    marks.mkdir()
    run = slow_fan.run(folder=str(marks), n=10, executor=ex, store=store, workers=2,
                       wait=False)
    wait_for(lambda: len(list(marks.iterdir())) >= 3, what="tasks to start")
    victim = int(sorted(marks.iterdir(), key=lambda p: p.stat().st_mtime)[-1]
                 .name.split("-")[2])
    os.kill(victim, signal.SIGKILL)
    assert run.wait(90) == "succeeded"
    outcomes = [a["outcome"] for a in run.attempts()]
    assert "lost" in outcomes, outcomes
    assert outcomes.count("ok") == 10
    assert sorted(run.result()) == list(range(10))


def test_timed_out_result_arrives_late_and_is_rejected(store: str,
                                                      shared_client: Any) -> None:
    run = with_timeout.run(executor=DaskExecutor(client=shared_client), store=store, workers=2)
    assert run.state == "succeeded"
    assert run.result() == ["on time", "done"]
    kinds = [n["kind"] for n in run.notices()]
    assert "late_result_rejected" in kinds, run.notices()
    outcomes = sorted(a["outcome"] for a in run.attempts())
    assert "timeout" in outcomes


def test_cancel_from_another_process(store: str, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run = polite_fan.run(folder=str(marks), n=8, executor=DaskExecutor(), store=store,
                         workers=2, wait=False)
    wait_for(lambda: any(t["state"] == "running" for t in run.tasks()), what="a running task")
    time.sleep(0.3)
    code = f"import ledgerflow; ledgerflow.cancel({run.run_id!r}, store={store!r})"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert run.wait(60) == "cancelled"
    states = {t["state"] for t in run.tasks()}
    assert states <= {"cancelled"}, states
    assert list(marks.glob("saw-cancel-*")), "the running tasks saw cancel_requested"


DRIVER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from ledgerflow import pipeline, task

    @task
    def effect(i: int, folder: str) -> int:
        with open(os.path.join(folder, f"effect-{i}"), "a") as f:
            f.write("x")
        time.sleep(0.15)
        return i

    @pipeline
    def effects(folder: str, n: int = 24):
        return effect.map(list(range(n)), folder=folder)

    if __name__ == "__main__":
        import ledgerflow_dask
        from ledgerflow.plugins import get_plugin_manager
        pm = get_plugin_manager()
        if not pm.has_plugin("dask"):
            pm.register(ledgerflow_dask, name="dask")
        store, folder = sys.argv[1], sys.argv[2]
        run = effects.run(folder=folder, store=store, executor="dask", workers=2, wait=False)
        Path(folder, "run_id").write_text(run.run_id)
        run.wait()
''')


def test_kill_driver_then_resume_keeps_committed_work(store: str, tmp_path: Path) -> None:
    script = tmp_path / "effects_flow.py"
    script.write_text(DRIVER)
    folder = tmp_path / "fx"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), store, str(folder)],
                            start_new_session=True)
    try:
        wait_for(lambda: len(list(folder.glob("effect-*"))) >= 8, timeout=60,
                 what="some tasks to run")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        with pytest.raises(ProcessLookupError):   # and its orphaned worker processes
            for _ in range(50):
                os.killpg(proc.pid, signal.SIGKILL)
                time.sleep(0.05)
    run_id = (folder / "run_id").read_text()
    before = {t["key"]: t["state"] for t in lf.get_run(run_id, store=store).tasks()}
    committed = [k for k, s in before.items() if s == "succeeded"]
    assert committed, before
    counts_before = {p.name: len(p.read_text()) for p in folder.glob("effect-*")}

    resumed = lf.resume(run_id, store=store, executor=DaskExecutor())
    assert resumed.state == "succeeded"
    counts = {p.name: len(p.read_text()) for p in folder.glob("effect-*")}
    assert len(counts) == 24
    for key in committed:
        i = key[key.index("[") + 1:key.rindex("]")].strip("'\"")
        name = f"effect-{i}"
        assert counts[name] == counts_before[name] == 1, (key, counts[name])


@pytest.fixture
def remote_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A scheduler and a 2-process worker started with the dask CLI."""
    bindir = Path(sys.executable).parent
    dask_cli = str(bindir / "dask") if (bindir / "dask").exists() else "dask"
    sfile = tmp_path / "scheduler.json"
    env = dict(os.environ)
    procs = [subprocess.Popen(
        [dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sfile)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)]
    try:
        wait_for(sfile.exists, what="the scheduler file")
        wait_for(lambda: "address" in sfile.read_text(), what="the scheduler address")
        address = json.loads(sfile.read_text())["address"]
        procs.append(subprocess.Popen(
            [dask_cli, "worker", address, "--host", "127.0.0.1", "--nworkers", "2",
             "--nthreads", "1", "--dashboard-address", "127.0.0.1:0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
        from distributed import Client
        with Client(address, set_as_default=False, timeout=30) as c:
            c.wait_for_workers(2, timeout=30)
        yield address, tmp_path
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def test_remote_scheduler_by_address_and_restart_guard(
        remote_cluster: tuple[str, Path], store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    address, tmp = remote_cluster
    marks = tmp / "marks"
    marks.mkdir()
    monkeypatch.setenv("LEDGERFLOW_DASK_ADDRESS", address)
    run = slow_fan.run(folder=str(marks), n=8, executor="dask", store=store, workers=2,
                       wait=False)
    ex = run._runner.executor            # the executor the plugin built from the setting
    assert isinstance(ex, DaskExecutor) and ex.address == address
    wait_for(lambda: len(list(marks.iterdir())) >= 3, what="tasks to start")
    newest = sorted(marks.iterdir(), key=lambda p: p.stat().st_mtime)[-1].name.split("-")
    item, victim = newest[0], int(newest[2])
    job_id = next(j for j, inst in list(run._runner.jobs.running.items())
                  if inst.key == f"slow_mark[{item}]")
    # the guard can only see a second start once the first announcement has arrived
    wait_for(lambda: ex._jobs[job_id].starts >= 1, what="the start announcement")
    os.kill(victim, signal.SIGKILL)     # this scheduler would re-run it silently
    assert run.wait(90) == "succeeded"
    assert sorted(run.result()) == list(range(8))
    outcomes = [a["outcome"] for a in run.attempts()]
    assert "lost" in outcomes, outcomes
    assert outcomes.count("ok") == 8
    lost = [a["error_message"] for a in run.attempts() if a["outcome"] == "lost"]
    assert any("Dask started it again" in m for m in lost), lost


def test_unreachable_scheduler_is_a_clear_error(store: str) -> None:
    from ledgerflow.errors import ConfigError

    settings = Settings(workers=1, dask_address="tcp://127.0.0.1:9",
                        options={"dask_connect_timeout": "1"})
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler"):
        make_executor("dask", settings)


def test_cancel_before_start_never_runs(shared_client: Any) -> None:
    """A job cancelled while queued is confirmed cancelled and reported once."""
    from ledgerflow.executor import Completion, Job

    got: list[Completion] = []
    lock = threading.Lock()

    def record(c: Completion) -> None:
        with lock:
            got.append(c)

    ex = DaskExecutor(client=shared_client, cancel_grace=0.2)
    ex.start(workers=2, on_complete=record)
    try:
        for i in range(1, 5):
            ex.submit(Job(id=i, run_id="r", task_key=f"k{i}", attempt=1, fn=time.sleep,
                          args=(1.0,), kwargs={}, idempotency_key="idem", task_name="nap"))
        for i in range(1, 5):
            ex.cancel(i, reason="cancel")
        wait_for(lambda: len(got) == 4, timeout=20, what="four reports")
        time.sleep(1.5)
    finally:
        ex.shutdown()
    assert sorted(c.job_id for c in got) == [1, 2, 3, 4]
    assert {c.outcome for c in got} <= {"cancelled"}
