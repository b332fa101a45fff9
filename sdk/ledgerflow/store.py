"""The run-store interface: what the runner, the CLI and readers need from a store.

:class:`RunStore` is what every store implements; the optional capabilities
a store may add (a block of reads, a summed read of a big run, the rows a
resume may change, a fold on demand, a lease-loss probe, worker folders) are
declared below it as functions, the one place that looks them up, the way
:mod:`ledgerflow.executor` declares the executor's.

The runner hands a store typed journal records (:mod:`ledgerflow.records`)
in group commits; a store makes each commit durable before
:meth:`RunStore.append` returns, and answers reads exactly as if it had
applied the same records with :func:`ledgerflow.projection.apply` (the
contract suite in :mod:`ledgerflow.testing` checks this).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .records import Record
from .results import Encoded
from .views import RunView, TaskRow

#: A cache-index entry: (run_id, task_key, content hash, kind, data, uri, size).
CacheHit = tuple[str, str, str, str, "str | None", "str | None", int]


class CacheIndex(Mapping[str, CacheHit]):
    """The fingerprints with a committed result, their entries read on the first hit.

    A ledger that ran a task 100,000 times with other inputs holds 100,000
    entries that a new run almost never hits: a store hands the runner the
    fingerprints alone (a set) and ``load`` reads the entries only when a task
    does hit one.
    """

    def __init__(self, fingerprints: set[str],
                 load: Callable[[], Mapping[str, CacheHit]]) -> None:
        self.fingerprints = fingerprints
        self._load = load
        self._rows: Mapping[str, CacheHit] | None = None

    def _entries(self) -> Mapping[str, CacheHit]:
        if self._rows is None:
            self._rows = self._load()
        return self._rows

    def __getitem__(self, fp: str) -> CacheHit:
        if fp not in self.fingerprints:
            raise KeyError(fp)
        return self._entries()[fp]

    def __contains__(self, fp: object) -> bool:
        return fp in self.fingerprints and fp in self._entries()

    def get(self, fp: str, default: Any = None) -> Any:
        """The entry of ``fp``, or ``default``: a miss costs one set lookup (the runner
        asks once a task; ``Mapping.get`` would raise and catch a KeyError, ~1 µs)."""
        if fp not in self.fingerprints:
            return default
        return self._entries().get(fp, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())

    @property
    def loaded(self) -> bool:
        """True once the entries were read (a task hit one)."""
        return self._rows is not None


@dataclass(slots=True, frozen=True)
class Lease:
    """The right to drive a run; ``token`` fences out older drivers."""

    run_id: str
    token: int


@runtime_checkable
class RunStore(Protocol):
    """What the runner and the CLI need from a store plugin."""

    name: str
    location: str

    def create_run(self, run_id: str, records: Sequence[Record]) -> Lease:
        """Record a new run (its ``RunDefined`` record first) and lease it to the caller."""

    def take_over(self, run_id: str) -> Lease:
        """Lease an existing run whose driver is gone; raises NotResumableError if alive."""

    def append(self, lease: Lease, records: Sequence[Record]) -> None:
        """Durably add records (one group commit); raises LeaseLostError if superseded."""

    def release(self, lease: Lease) -> None:
        """Give the lease up (the run stopped driving)."""

    def put_blob(self, enc: Encoded) -> str | None:
        """Store a large result's bytes; return its URI (None: keep inline)."""

    def read_blob(self, kind: str, data: str | None, uri: str | None) -> Any:
        """Load a stored result's value."""

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        """Read one run (raises RunNotFoundError).

        ``tasks=False`` reads only the run's own row; ``upstream=False`` may leave
        :attr:`TaskRow.upstream` empty (only lineage needs it).
        """

    def list_runs(self, limit: int = 50) -> list[RunView]:
        """Newest runs first, without task rows' details guaranteed."""

    def request_cancel(self, run_id: str) -> None:
        """Ask the run's driver (any process) to cancel."""

    def cancel_requested(self, run_id: str) -> bool:
        """True once a cancel was requested for ``run_id``; cheap (polled by drivers)."""

    def cache_lookup(self, task_names: Iterable[str],
                     exclude_run: str | None = None) -> Mapping[str, CacheHit]:
        """Map fingerprint -> :data:`CacheHit` of committed results of these tasks
        (``exclude_run``: a run being resumed keeps its own); a big index may come as
        a :class:`CacheIndex` that reads its entries on the first hit."""

    def lineage(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        """Lineage rows (direction, uri, content hash, attempt, code version)."""

    def notices(self, run_id: str) -> list[dict[str, Any]]:
        """Rejected late or duplicate results and other notes for a run."""

    def attempts(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        """One row per finished attempt."""

    def events(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        """Every task transition of a run, in the order it was made (``seq``)."""

    def logs(self, run_id: str, task_key: str | None = None,
             attempt: int | None = None) -> list[dict[str, Any]]:
        """What attempts wrote (stdout, stderr, logging), one row per attempt."""

    def blob_exists(self, uri: str) -> bool:
        """True if the result file behind ``uri`` is still there."""

    def decide(self, run_id: str, task_key: str, digest: str, decision: str, by: str,
               reason: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record a decision on the approval request ``digest`` from any process.

        Atomic: of two deciders of one request exactly one wins; the others get
        ApprovalConflictError. Returns the decision (``decided_at`` set; with
        ``arguments`` when the approver edited them: :mod:`ledgerflow.edits`).
        """

    def approval_decisions(self, run_id: str) -> list[dict[str, Any]]:
        """Every decision made on the run's requests (recorded or not yet journaled)."""

    def approvals(self, run_id: str) -> list[dict[str, Any]]:
        """The run's approval requests, each with its decision (``state``)."""

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        """Results of steps tasks recorded (``context().step``)."""

    def model_calls(self, run_id: str) -> list[dict[str, Any]]:
        """Every model call of the run (fields of ``records.ModelCall``)."""

    def tool_calls(self, run_id: str) -> list[dict[str, Any]]:
        """Every tool call of the run (fields of ``records.ToolCall``)."""

    def recover(self) -> None:
        """Bring what is derived from the records up to date (e.g. fold the journals a
        killed driver left). Called by commands that may write, before they read."""

    def doctor(self) -> list[dict[str, Any]]:
        """What is wrong with the store: ``{"problem", "what", "fix"}`` per finding."""

    def repair(self) -> tuple[str, list[str]]:
        """Rebuild derived state from the records; return (where the old copy is kept,
        what could not be kept)."""

    def close(self) -> None:
        """Release files and connections."""


# -- optional capabilities: a store offers them as methods of these names ------------------
def reading(store: object) -> contextlib.AbstractContextManager[None]:
    """A block of reads sharing one connection, where the store offers it (its optional
    ``reading()``: the DuckDB store opens its file once for the block, not once a read).

    Only around reads that follow one another: the block keeps the ledger to this
    thread, so never around driving a run.
    """
    block = getattr(store, "reading", None)
    return block() if block is not None else contextlib.nullcontext()


def summarize(store: object, run_id: str, *, min_tasks: int) -> RunView | None:
    """The run with its tasks summed per name and no task rows, where the store can sum
    a run of at least ``min_tasks`` tasks in place (its optional ``summarize``); None
    when only a full read answers right."""
    method = getattr(store, "summarize", None)
    return None if method is None else method(run_id, min_tasks=min_tasks)


def unsettled(store: object, run_id: str) -> tuple[RunView, int] | None:
    """The run with only the rows a resume may change, and how many successes it leaves
    out (its optional ``unsettled``); None when every row must be read."""
    method = getattr(store, "unsettled", None)
    return None if method is None else method(run_id)


def frontier(store: object, run_id: str) -> RunView | None:
    """The run as a resume first reads it, where the store can (its optional
    ``frontier``): the rows of the tasks the resume may change, and in
    ``RunView.settled`` only the keys of the successes it keeps, whose rows
    :func:`task_rows` reads when a task that runs needs them. None: read every row."""
    method = getattr(store, "frontier", None)
    return None if method is None else method(run_id)


def task_rows(store: object, run_id: str, keys: list[str]) -> dict[str, TaskRow]:
    """The rows of the run's tasks ``keys`` (its optional ``task_rows``, else from a
    full read), for the successes a :func:`frontier` read left out."""
    method = getattr(store, "task_rows", None)
    if method is not None:
        rows: dict[str, TaskRow] = method(run_id, keys)
        return rows
    tasks = store.get_run(run_id, upstream=False).tasks  # type: ignore[attr-defined]
    return {k: tasks[k] for k in keys if k in tasks}


def fold(store: object) -> list[str] | None:
    """Fold what drivers that are gone left unfolded now (its optional ``fold``); the runs
    folded, or None if the store has no fold."""
    method = getattr(store, "fold", None)
    return None if method is None else list(method())


def lease_probe(store: object) -> Callable[[Lease], str | None] | None:
    """The store's cheap, local ``lease_lost(lease)`` (why this process lost the lease,
    None while it holds), polled by the runner; None if the store has none."""
    return getattr(store, "lease_lost", None)


def worker_folders(store: object, run_id: str) -> tuple[str, str] | None:
    """(ledger folder, run folder) where workers on this machine may keep durable files
    (step logs, budgets), or None when the store has no folder (its optional
    ``worker_folders``)."""
    method = getattr(store, "worker_folders", None)
    return None if method is None else method(run_id)
