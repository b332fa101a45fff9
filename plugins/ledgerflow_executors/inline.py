"""The ``inline`` executor: run each attempt in the driver thread, at once.

For debugging and for the lowest overhead. It cannot interrupt a task: a
timeout is detected when the attempt returns, and its result is rejected.
"""

from __future__ import annotations

from collections.abc import Callable

from ledgerflow import hookimpl
from ledgerflow.config import Settings
from ledgerflow.executor import Completion, Job, execute


class InlineExecutor:
    """Runs jobs synchronously inside :meth:`submit`."""

    name = "inline"
    #: the runner calls each attempt itself, one at a time, in the driver thread
    runs_in_driver = True

    def __init__(self) -> None:
        self._done: Callable[[Completion], None] | None = None
        self._cancelled = False

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        self._done = on_complete

    def submit(self, job: Job) -> None:
        assert self._done is not None
        self._done(execute(job, self._is_cancelled))

    def _is_cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, job_id: int, *, reason: str) -> None:
        # Nothing runs when the driver can call this: jobs finish inside submit().
        return None

    def shutdown(self) -> None:
        self._done = None


@hookimpl
def ledgerflow_executor_names() -> list[str]:
    return ["inline"]


@hookimpl
def ledgerflow_make_executor(name: str, settings: Settings) -> InlineExecutor | None:
    return InlineExecutor() if name == "inline" else None
