"""What is in flight in one drive: the attempts handed out (:class:`Jobs`) and the
timers of their timeouts and retry delays (:class:`Timers`)."""

from __future__ import annotations

import heapq
import time
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .executor import Completion
    from .plan import Instance


class Timers:
    """A heap of ``(when, kind, payload)``; ``kind`` is ``timeout`` (payload: a job id)
    or ``retry`` (payload: the task instance waiting in ``retry_wait``)."""

    __slots__ = ("heap", "n")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, str, Any]] = []
        self.n = 0

    def __bool__(self) -> bool:
        return bool(self.heap)

    def add(self, delay: float, kind: str, payload: Any) -> None:
        """Fire ``kind`` with ``payload`` in ``delay`` seconds (monotonic clock)."""
        self.n += 1
        heapq.heappush(self.heap, (time.monotonic() + delay, self.n, kind, payload))

    def due(self) -> Iterator[tuple[str, Any]]:
        """Pop the timers whose time has come, soonest first."""
        now = time.monotonic()
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, _, kind, payload = heapq.heappop(heap)
            yield kind, payload

    def wait_at_most(self, limit: float) -> float:
        """Seconds until the soonest timer, at most ``limit``."""
        if not self.heap:
            return limit
        return min(limit, max(0.0, self.heap[0][0] - time.monotonic()))

    def retries_due(self) -> bool:
        """True if a retry is scheduled (the run is not only waiting for approvals)."""
        return any(kind == "retry" for _, _, kind, _ in self.heap)


class Jobs:
    """The attempts handed out in this drive, by job id (dense, from 1).

    Each job's task and attempt are kept for good (a list and an int array hold
    a million jobs in ~12 MB, a dict of tuples took ~140 MB), so a report for an
    attempt no longer running is told apart: late after its timeout, or a duplicate.
    """

    __slots__ = ("attempt", "running", "task", "timed_out")

    def __init__(self) -> None:
        self.running: dict[int, Instance] = {}
        self.timed_out: dict[int, tuple[str, int]] = {}     # job id -> (task, attempt)
        self.task: list[Instance] = []
        self.attempt = array("i")

    def __len__(self) -> int:
        """How many attempts are running (handed out, not yet reported or timed out)."""
        return len(self.running)

    def next_id(self) -> int:
        return len(self.task) + 1

    def add(self, job_id: int, inst: Instance) -> None:
        """``inst``'s current attempt runs as job ``job_id`` (from :meth:`next_id`)."""
        self.running[job_id] = inst
        self.task.append(inst)
        self.attempt.append(inst.attempt)

    def get(self, job_id: int) -> Instance | None:
        return self.running.get(job_id)

    def finish(self, job_id: int, outcome: str = "") -> Instance | None:
        """The task whose running attempt job ``job_id`` reported (None: not running).

        An executor that times jobs itself reports ``timeout``: a late report of that
        attempt is then rejected as late, as after a timeout the runner decides."""
        inst = self.running.pop(job_id, None)
        if inst is not None and outcome == "timeout":
            self.timed_out[job_id] = (inst.key, inst.attempt)
        return inst

    def abandon(self, job_id: int, inst: Instance) -> None:
        """The attempt timed out: a late report of it is rejected."""
        del self.running[job_id]
        self.timed_out[job_id] = (inst.key, inst.attempt)

    def stray(self, c: Completion) -> tuple[str, int, str, str] | None:
        """For a report of no running attempt: (task, attempt, notice kind, message) to
        record, or None for a job this drive never handed out."""
        late = self.timed_out.get(c.job_id)
        if late is not None:
            return (*late, "late_result_rejected",
                    f"result ({c.outcome}) arrived after the attempt timed out; "
                    "rejected, not applied")
        if 0 < c.job_id <= len(self.task):     # neither running nor timed out: done
            return (self.task[c.job_id - 1].key, self.attempt[c.job_id - 1],
                    "duplicate_result_rejected",
                    f"a second report ({c.outcome}) for an attempt already finished; "
                    "rejected")
        return None
