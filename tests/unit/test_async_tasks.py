"""``async def`` tasks: each attempt runs its coroutine to the end, inside a running loop too."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import pipeline, task


@task
async def fetch(folder: str, i: int) -> int:
    await asyncio.sleep(0.01)
    with open(Path(folder) / "threads.log", "a") as log:
        log.write(threading.current_thread().name + "\n")
    return i * 10


@task(retries=2, retry_delay=0)
async def flaky(folder: str, xs: list[int]) -> int:
    await asyncio.sleep(0)
    marker = Path(folder) / "failed-once"
    if not marker.exists():
        marker.touch()
        raise ConnectionError("not yet")
    return sum(xs)


@pipeline
def gather(folder: str, n: int = 3):
    return flaky(folder, [fetch(folder, i) for i in range(n)])


@pytest.mark.parametrize("executor", ["inline", "threads", "processes"])
def test_async_tasks_run_retry_and_return_their_value(tmp_path: Path, ledger: str,
                                                      executor: str) -> None:
    run = gather.run(str(tmp_path), store=ledger, executor=executor)
    assert run.state == "succeeded"
    assert run.result() == 30
    assert run.status().tasks["flaky"].attempts == 2


def test_an_async_task_called_inside_a_running_loop_still_finishes(tmp_path: Path,
                                                                   ledger: str) -> None:
    async def notebook_cell() -> ledgerflow.Run:    # a notebook's kernel runs a loop
        return gather.run(str(tmp_path), store=ledger, executor="inline")

    run = asyncio.run(notebook_cell())
    assert run.state == "succeeded" and run.result() == 30
    names = (tmp_path / "threads.log").read_text().split()
    assert len(names) == 3 and all(n.startswith("ledgerflow-async") for n in names)
