"""The trace carrier of an attempt: its ``traceparent``, travelling with the job (stdlib).

Pickled with the :class:`~ledgerflow.executor.Job` to whatever process runs
the attempt; there :meth:`TraceCarrier.scope` makes the attempt's span
current around the task call (OpenTelemetry is imported only then).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class TraceCarrier:
    """W3C trace-context headers of an attempt's span (a ``ledgerflow.executor.Carrier``)."""

    headers: dict[str, str]
    #: The driver's pid, and the folder a worker process sends the task's spans back to.
    origin: int = 0
    sink: str | None = None

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Attach the attempt's span context for the duration of the task call."""
        from ._otel import attached
        return attached(self.headers, self.origin, self.sink)
