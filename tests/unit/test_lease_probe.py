"""The runner's lease probe: a store that says its lease is lost stops the driver.

A store may offer ``lease_lost(lease) -> str | None``; the runner polls it
with its cancel check, stops dispatching, cancels the attempts in flight and
raises LeaseLostError (``pipeline`` prints ``Error: lease lost: ...``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ledgerflow import context, pipeline, task
from ledgerflow.context import TaskCancelled
from ledgerflow.errors import LeaseLostError
from ledgerflow_stores.memory import MemoryStore

started: list[str] = []
stopped: list[str] = []
finished: list[str] = []


class FencedStore(MemoryStore):
    """A memory store whose lease can be declared lost from outside."""

    def __init__(self) -> None:
        super().__init__("memory:fenced")
        self.reason: str | None = None

    def lease_lost(self, lease: Any) -> str | None:
        return self.reason


@task
def waits(i: int) -> int:
    ctx = context()
    started.append(ctx.task_key)
    for _ in range(500):
        if ctx.cancel_requested:
            stopped.append(ctx.task_key)
            raise TaskCancelled()
        time.sleep(0.01)
    finished.append(ctx.task_key)
    return i


@pipeline
def many(n: int = 6):
    return waits.map(list(range(n)))


@pytest.mark.parametrize("executor", ["threads", "inline"])
def test_a_lost_lease_stops_dispatch_and_cancels_running_work(executor: str) -> None:
    started.clear(), stopped.clear(), finished.clear()
    st = FencedStore()

    def fence() -> None:
        while not started:
            time.sleep(0.005)
        st.reason = "run r was taken over by another driver"
    threading.Thread(target=fence, daemon=True).start()
    with pytest.raises(LeaseLostError, match="lease lost: run r was taken over"):
        many.run(store=st, executor=executor, workers=2)
    assert not finished                             # each would take 5 s
    deadline = time.monotonic() + 5
    while sorted(stopped) != sorted(started) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(stopped) == sorted(started)      # every attempt that ran was stopped
    assert len(started) <= 2                        # nothing dispatched after the loss
