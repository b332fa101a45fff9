"""Every read the console makes of the ledger, in one place, through the public API.

Each function opens what it needs, reads, and lets go: a request never keeps
the DuckDB file open, so runs driven by other processes go on while the
console is open. The store is named by the path the console was started
with (``None``: the default ledger, or ``LEDGERFLOW_STORE``).

The panels for logs, approvals and usage call ``Run.logs``, ``Run.approvals``
and ``Run.usage`` when the installed ledgerflow has them, and say so
(:data:`UNSUPPORTED`) when it does not.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any, Final

import ledgerflow
from ledgerflow import Run
from ledgerflow.errors import TaskNotFoundError
from ledgerflow.views import RunView, lineage_of

#: What a reader of an optional panel returns when this ledgerflow lacks the method.
UNSUPPORTED: Final = None

_gc_lock = threading.Lock()
_gc_depth = 0
_gc_saved: tuple[int, int, int] = (700, 10, 10)


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the cyclic GC from walking the heap while 100,000 rows become objects.

    Reading a large run allocates a few objects per task and no cycles; with
    the default threshold the collector runs hundreds of times (a third of
    the read). Nested and concurrent blocks share one raised threshold.
    """
    global _gc_depth, _gc_saved
    with _gc_lock:
        if _gc_depth == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(max(_gc_saved[0], 200_000), _gc_saved[1], _gc_saved[2])
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0:
                gc.set_threshold(*_gc_saved)


class Ledger:
    """The ledger a console shows: reads through ``ledgerflow``'s public API."""

    def __init__(self, store: str | None = None) -> None:
        self.store = store

    # -- runs ----------------------------------------------------------------------------
    def runs(self, limit: int = 200) -> list[RunView]:
        """The newest runs, as ``pipeline runs`` lists them."""
        with quiet_gc():
            return ledgerflow.runs(store=self.store, limit=limit)

    def run(self, run_id: str) -> Run:
        """A handle on one run (raises ``RunNotFoundError``); reads only its run row."""
        return ledgerflow.get_run(run_id, store=self.store)

    def view(self, run: Run, *, upstream: bool = False) -> RunView:
        """The run and its task rows: the read ``pipeline status`` makes.

        ``upstream=False`` leaves ``TaskRow.upstream`` empty (only the graph
        needs it, and turning the lists into Python is half the read).
        """
        with quiet_gc():
            if upstream:
                return run.status()
            return run.store.get_run(run.run_id, upstream=False)

    def head(self, run: Run) -> RunView:
        """Only the run's own row: state, reason, times, whether its driver is alive."""
        return run.store.get_run(run.run_id, tasks=False)

    def location(self, run: Run) -> str:
        """Where the run's ledger lives (a file path for the ``duckdb`` store)."""
        return run.store.location

    def store_kind(self, run: Run) -> str:
        """The name of the store plugin that holds the run (``duckdb``, ``memory``...)."""
        return str(getattr(run.store, "name", ""))

    # -- per-run details -----------------------------------------------------------------
    def attempts(self, run: Run, task_key: str | None = None) -> list[dict[str, Any]]:
        """Every finished attempt (all retries), in the order they were recorded."""
        with quiet_gc():
            return run.attempts(task_key)

    def notices(self, run: Run) -> list[dict[str, Any]]:
        """Rejected late results and other notes of the run."""
        return run.notices()

    def lineage(self, run: Run, task_key: str | None = None, *,
                view: RunView | None = None) -> list[dict[str, Any]]:
        """The rows ``pipeline lineage RUN_ID [--task KEY] --json`` prints.

        With a task: its own rows, then those of every upstream task it
        depends on (the same order as the CLI). ``view``: the run as already
        read with upstream lists (saves a read).
        """
        if task_key is None:
            with quiet_gc():
                return run.lineage(None)
        if view is None:
            view = self.view(run, upstream=True)
        if task_key not in view.tasks:
            raise TaskNotFoundError(run.run_id, task_key, view.tasks)
        with quiet_gc():
            return lineage_of(view, run.lineage(None), task_key)

    # -- panels the kernel is gaining (shown only when the method exists) -----------------
    def has(self, method: str) -> bool:
        """True if this ledgerflow's ``Run`` has ``method`` (``logs``, ``approvals``...)."""
        return callable(getattr(Run, method, None))

    def logs(self, run: Run, task_key: str, attempt: int | None = None
             ) -> list[dict[str, Any]] | None:
        """Captured output of a task's attempts (``Run.logs``), or UNSUPPORTED."""
        fn = getattr(run, "logs", None)
        if not callable(fn):
            return UNSUPPORTED
        return list(fn(task_key, attempt=attempt))

    def approvals(self, run: Run) -> list[dict[str, Any]] | None:
        """Approval requests and decisions of the run (``Run.approvals``), or UNSUPPORTED."""
        fn = getattr(run, "approvals", None)
        if not callable(fn):
            return UNSUPPORTED
        rows = list(fn())
        try:      # what an approver sees: argument values, what changed (ledgerflow.approval)
            from ledgerflow.approval import previous_of, request_doc
        except ImportError:
            return rows
        keep = ("arguments", "inputs", "changed", "previous", "editable")
        return [{**r, **{k: v for k, v in request_doc(r, previous_of(rows, r)).items()
                         if k in keep}} for r in rows]

    def calls(self, run: Run) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The run's model calls and tool calls (``Run.model_calls``, ``Run.tool_calls``)."""
        mc = getattr(run, "model_calls", None)
        tc = getattr(run, "tool_calls", None)
        return (list(mc()) if callable(mc) else []), (list(tc()) if callable(tc) else [])

    def usage(self, run: Run) -> Any:
        """Model and tool calls with their usage (``Run.usage``), or UNSUPPORTED."""
        fn = getattr(run, "usage", None)
        if not callable(fn):
            return UNSUPPORTED
        return fn()
