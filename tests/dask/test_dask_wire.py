"""The dask executor's wire: small jobs, compact answers, timeouts counted from the start."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerflow import context, pipeline, task
from ledgerflow.executor import Completion, Job
from ledgerflow_dask import DaskExecutor
from tests.waiting import wait_until

pytestmark = [pytest.mark.dask, pytest.mark.timeout(180)]

#: What one job of a trivial task may cost on the wire, pickled as the scheduler keeps
#: it (its run spec: function reference, spec id, job id, task key, attempt, arguments):
#: about 205 bytes (raw ``client.submit`` of the same function: ~150). Before the spec
#: was registered once per worker it was 530 (function by reference) to ~1,000 bytes.
JOB_BYTES = 320
#: What a plain success may cost coming back (it used to be ~400 bytes of Completion).
ANSWER_BYTES = 64


@task(cache=False)
def ident(x: int, salt: int = 0) -> int:
    return x


@task(cache=False)
def wide(n: int) -> str:
    return "x" * n


@task(retries=2, cache=False)
def second_time(i: int) -> int:
    if context().attempt == 1:
        raise ValueError(f"first attempt of {i}")
    return i * 10


@pipeline
def mixed_fan(n: int = 40):
    return [ident.map(list(range(n)), salt=7), second_time.map([1, 2, 3]), wide(200_000)]


@task(timeout=4.0, cache=False)
def timed_after_queue(i: int) -> int:
    return i


@task(cache=False)
def hog(seconds: float) -> str:
    time.sleep(seconds)
    return "hogged"


@pipeline
def queued_timeouts():
    hogs = hog.map([6.0, 6.0])
    return [hogs, timed_after_queue.map([1, 2])]


class Reports:
    """Collects an executor's reports (thread-safe) and waits for them; a job is
    reported once, except that a result may follow a ``timeout`` report (``late``)."""

    def __init__(self) -> None:
        self.got: dict[int, Completion] = {}
        self.late: list[Completion] = []
        self.cond = threading.Condition()

    def __call__(self, c: Completion) -> None:
        with self.cond:
            first = self.got.get(c.job_id)
            assert first is None or (first.outcome == "timeout" and not self.late), \
                f"job {c.job_id} reported twice"
            if first is None:
                self.got[c.job_id] = c
            else:
                self.late.append(c)
            self.cond.notify_all()

    def wait(self, ids: set[int], timeout: float = 60.0) -> dict[int, Completion]:
        with self.cond:
            assert self.cond.wait_for(lambda: ids <= self.got.keys(), timeout), \
                f"no report for {sorted(ids - self.got.keys())}"
            return dict(self.got)


@pytest.fixture
def executor(shared_client: Any) -> Iterator[tuple[DaskExecutor, Reports]]:
    reports = Reports()
    ex = DaskExecutor(client=shared_client, cancel_grace=0.5)
    ex.start(workers=2, on_complete=reports)
    yield ex, reports
    ex.shutdown()


def job(i: int, fn: Any, *args: Any, timeout: float | None = None, **kwargs: Any) -> Job:
    return Job(id=i, run_id="run-wire", task_key=f"{fn.name}[{i}]", attempt=1, fn=fn,
               args=args, kwargs=kwargs, timeout=timeout, task_name=fn.name)


def _run_specs(dask_scheduler: Any, prefix: str) -> dict[str, int]:
    from distributed.protocol.pickle import dumps
    return {str(k): len(dumps(ts.run_spec)) for k, ts in dask_scheduler.tasks.items()
            if str(k).startswith(prefix) and ts.run_spec is not None}


def test_a_job_travels_in_a_few_hundred_bytes(shared_client: Any,
                                              executor: tuple[DaskExecutor, Reports]) -> None:
    ex, reports = executor
    hogs, _ = busy_workers(shared_client, 5.0)     # the jobs stay on the scheduler
    for i in range(1, 6):
        ex.submit(job(i, ident, i, salt=3))
    sizes: dict[str, int] = {}
    end = time.monotonic() + 30     # the submits reach the scheduler asynchronously
    while len(sizes) < 5 and time.monotonic() < end:
        time.sleep(0.05)
        sizes = shared_client.run_on_scheduler(_run_specs, prefix="ident-")
    assert len(sizes) == 5, sizes
    assert max(sizes.values()) <= JOB_BYTES, sizes
    got = reports.wait({1, 2, 3, 4, 5})
    assert [got[i].outcome for i in range(1, 6)] == ["ok"] * 5
    assert [got[i].encoded.data for i in range(1, 6)] == [b"1", b"2", b"3", b"4", b"5"]
    assert all(got[i].started_at <= got[i].ended_at for i in range(1, 6))
    del hogs


def test_a_plain_success_comes_back_small(shared_client: Any) -> None:
    from ledgerflow_dask.wire import Specs, load_completion
    from ledgerflow_dask.worker import run_job

    spec = Specs("t0k3n").get(shared_client, job(1, ident, 0), topic=None)
    answer = shared_client.submit(run_job, spec.id, 9, "ident[9]", 1, (41,), {},
                                  pure=False).result()
    assert len(pickle.dumps(answer)) <= ANSWER_BYTES, answer
    c = load_completion(9, answer)
    assert (c.outcome, c.encoded.kind, c.encoded.data) == ("ok", "json", b"41")
    from ledgerflow.keys import digest
    assert c.encoded.hash == digest(b"41")


def _forget_every_spec() -> int:
    from ledgerflow_dask import worker
    with worker._LOCK:
        n = len(worker._SPECS)
        worker._SPECS.clear()
    return n


def test_a_worker_without_the_spec_gets_it_with_the_job(
        shared_client: Any, executor: tuple[DaskExecutor, Reports]) -> None:
    ex, reports = executor
    ex.submit(job(1, ident, 1))
    reports.wait({1})
    assert sum(shared_client.run(_forget_every_spec).values()) >= 2   # as if new workers
    for i in range(2, 6):
        ex.submit(job(i, ident, i))
    got = reports.wait({2, 3, 4, 5})
    assert [(got[i].outcome, got[i].encoded.data) for i in range(2, 6)] == \
        [("ok", str(i).encode()) for i in range(2, 6)]


def test_results_attempts_and_a_large_result_through_a_run(store: str,
                                                           shared_client: Any) -> None:
    run = mixed_fan.run(n=40, executor=DaskExecutor(client=shared_client), store=store,
                        workers=2)
    assert run.state == "succeeded"
    idents, seconds, big = run.result()
    assert idents == list(range(40))
    assert seconds == [10, 20, 30]
    assert big == "x" * 200_000             # too big to push: fetched from the worker
    attempts = {(a["task_key"], a["attempt"]): a["outcome"] for a in run.attempts()}
    assert [attempts[(f"second_time[{i}]", n)] for i in (1, 2, 3) for n in (1, 2)] == \
        ["error", "ok"] * 3
    assert sum(1 for o in attempts.values() if o == "ok") == 40 + 3 + 1


def busy_workers(client: Any, seconds: float) -> tuple[list[Any], float]:
    """Occupy every worker thread for ``seconds``; the futures and when they all ran."""
    hogs = [client.submit(time.sleep, seconds, workers=[w], pure=False,
                          allow_other_workers=False) for w in client.nthreads()]
    wait_until(lambda: sum(len(v) for v in client.call_stack().values()) >= len(hogs),
               what="the hogs to start", every=0.05)
    return hogs, time.time()


def test_a_queued_job_does_not_time_out_before_it_starts(
        shared_client: Any, executor: tuple[DaskExecutor, Reports]) -> None:
    ex, reports = executor
    hogs, busy_since = busy_workers(shared_client, 5.0)
    for i in (1, 2):        # they wait ~5 s in Dask's queue, longer than their timeout
        ex.submit(job(i, ident, i, timeout=3.0))
    got = reports.wait({1, 2}, timeout=90)
    assert {i: got[i].outcome for i in (1, 2)} == {1: "ok", 2: "ok"}, \
        {i: got[i].error_message for i in got}
    assert got[1].started_at >= busy_since + 3.5      # it did wait behind the hogs
    assert [got[i].encoded.data for i in (1, 2)] == [b"1", b"2"]
    del hogs


def test_no_result_within_the_timeout_of_its_start_is_a_timeout(
        shared_client: Any, executor: tuple[DaskExecutor, Reports]) -> None:
    ex, reports = executor
    ex.submit(job(1, hog, 4.0, timeout=1.0))
    c = reports.wait({1}, timeout=60)[1]
    assert c.outcome == "timeout" and c.error_type == "TaskTimedOut"
    assert "of its start on the Dask worker" in c.error_message
    assert c.started_at > 0
    # the late result is reported after the timeout, once (the runner rejects it as late)
    with reports.cond:
        assert reports.cond.wait_for(lambda: reports.late, 60), "no late report"
    (late,) = reports.late
    assert late.job_id == 1 and late.outcome == "ok"
    assert list(reports.got) == [1]


def test_a_run_queues_timed_tasks_behind_busy_workers(store: str,
                                                      shared_client: Any) -> None:
    # four runner workers on a two-thread cluster: the timed tasks wait in Dask's queue
    run = queued_timeouts.run(executor=DaskExecutor(client=shared_client), store=store,
                              workers=4)
    assert run.state == "succeeded", [(a["task_key"], a["outcome"]) for a in run.attempts()]
    assert run.result() == [["hogged", "hogged"], [1, 2]]
