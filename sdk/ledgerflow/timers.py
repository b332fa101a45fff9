"""The timers of one drive: attempt timeouts and retry delays, soonest first."""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from typing import Any


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
