"""The run-store interface and the journal records every store receives.

The runner hands a store *records* (tuples, see ``RECORD_KINDS``) in group
commits; a store makes each commit durable before :meth:`RunStore.append`
returns. :func:`apply` folds records into a :class:`RunView`; stores that
keep state elsewhere (DuckDB tables) must answer reads exactly as if they
had applied the same records (the contract suite in
``ledgerflow.testing`` checks this).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .results import Encoded

#: kind -> field names after the kind tag.
RECORD_KINDS: dict[str, tuple[str, ...]] = {
    "D": ("run_id", "pipeline", "target", "params", "created_at", "options"),
    "H": ("token", "pid", "host", "at"),
    "T": ("key", "task_name", "node", "item_key", "position", "upstream", "code_version", "at"),
    "E": ("seq", "key", "attempt", "from_state", "to_state", "reason", "at"),
    "A": ("key", "attempt", "outcome", "started_at", "ended_at", "error_type",
          "error_message", "traceback"),
    "R": ("key", "attempt", "fingerprint", "content_hash", "kind", "data", "uri", "size",
          "cached_from"),
    "L": ("key", "attempt", "direction", "uri", "content_hash", "attrs"),
    "N": ("key", "attempt", "kind", "message", "at"),
    "S": ("state", "reason", "at"),
}

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "upstream_failed"})


@dataclass(slots=True)
class TaskRow:
    """The current state of one task of a run, as stored."""

    key: str
    task_name: str = ""
    node: str = ""
    item_key: str | None = None
    position: int | None = None
    upstream: list[str] = field(default_factory=list)
    code_version: str = ""
    state: str = "pending"
    attempts: int = 0
    budget_base: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    fingerprint: str | None = None
    result_hash: str | None = None
    result_kind: str | None = None
    result_data: str | None = None
    result_uri: str | None = None
    result_size: int = 0
    cached_from: str | None = None
    result_attempt: int = 0

    def as_json(self) -> dict[str, Any]:
        """The shape ``pipeline status --json`` prints for a task."""
        return {"key": self.key, "task": self.task_name, "state": self.state,
                "attempts": self.attempts, "started_at": _iso(self.started_at),
                "ended_at": _iso(self.ended_at), "error": self.error,
                "cached": self.cached_from is not None}


@dataclass(slots=True)
class RunView:
    """A run and its tasks, as any process can read them."""

    run_id: str
    pipeline: str = ""
    target: str | None = None
    params: str = "{}"
    options: str = "{}"
    created_at: float = 0.0
    state: str = "running"
    reason: str = ""
    ended_at: float | None = None
    token: int = 0
    max_seq: int = 0
    tasks: dict[str, TaskRow] = field(default_factory=dict)
    driver_pid: int | None = None
    driver_host: str | None = None
    driver_alive: bool | None = None
    #: Set by listings that read counts without loading task rows.
    task_counts: dict[str, int] | None = None

    def counts(self) -> dict[str, int]:
        """Number of tasks in each state."""
        if self.task_counts is not None and not self.tasks:
            return dict(self.task_counts)
        out: dict[str, int] = {}
        for row in self.tasks.values():
            out[row.state] = out.get(row.state, 0) + 1
        return out

    def as_json(self) -> dict[str, Any]:
        """The document ``pipeline status --json`` prints."""
        return {"run_id": self.run_id, "pipeline": self.pipeline, "state": self.state,
                "reason": self.reason, "created_at": _iso(self.created_at),
                "ended_at": _iso(self.ended_at), "driver_alive": self.driver_alive,
                "counts": self.counts(),
                "tasks": [t.as_json() for t in self.tasks.values()]}


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def apply(view: RunView, records: Iterable[Sequence[Any]]) -> RunView:
    """Fold journal records into ``view`` (in place) and return it."""
    tasks = view.tasks
    for rec in records:
        kind = rec[0]
        if kind == "E":
            _, seq, key, attempt, frm, to, _reason, at = rec
            row = tasks.get(key)
            if row is None:
                row = tasks[key] = TaskRow(key)
            row.state = to
            if attempt > row.attempts:
                row.attempts = attempt
            if to == "running" and row.started_at is None:
                row.started_at = at
            if to == "pending" and frm is not None:
                row.budget_base = attempt
                row.ended_at = None
            elif to in TERMINAL_STATES:
                row.ended_at = at
            if seq > view.max_seq:
                view.max_seq = seq
        elif kind == "T":
            _, key, name, node, item, pos, upstream, version, _at = rec
            row = tasks.get(key)
            if row is None:
                row = tasks[key] = TaskRow(key)
            row.task_name, row.node, row.item_key, row.position = name, node, item, pos
            row.upstream, row.code_version = list(upstream), version
        elif kind == "A":
            _, key, attempt, outcome, _s, _e, etype, emsg, _tb = rec
            row = tasks.get(key) or tasks.setdefault(key, TaskRow(key))
            if attempt > row.attempts:
                row.attempts = attempt
            row.error = None if outcome == "ok" else _error_text(outcome, etype, emsg)
        elif kind == "R":
            _, key, attempt, fp, chash, rkind, data, uri, size, cached = rec
            row = tasks.get(key) or tasks.setdefault(key, TaskRow(key))
            row.fingerprint, row.result_hash, row.result_kind = fp, chash, rkind
            row.result_data, row.result_uri, row.result_size = data, uri, size
            row.cached_from, row.result_attempt = cached, attempt
        elif kind == "S":
            view.state, view.reason = rec[1], rec[2]
            view.ended_at = rec[3] if rec[1] in ("succeeded", "failed", "cancelled") else None
        elif kind == "D":
            _, run_id, pipeline, target, params, created, options = rec
            view.run_id, view.pipeline, view.target = run_id, pipeline, target
            view.params, view.created_at, view.options = params, created, options
        elif kind == "H":
            view.token = max(view.token, rec[1])
            view.driver_pid, view.driver_host = rec[2], rec[3]
    return view


def _error_text(outcome: str, etype: str, emsg: str) -> str:
    if outcome in ("timeout", "lost", "cancelled"):
        return f"{outcome}: {emsg}" if emsg else outcome
    return f"{etype}: {emsg}" if etype else emsg


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

    def create_run(self, run_id: str, records: Sequence[Sequence[Any]]) -> Lease:
        """Record a new run (its ``D`` record first) and lease it to the caller."""

    def take_over(self, run_id: str) -> Lease:
        """Lease an existing run whose driver is gone; raises NotResumableError if alive."""

    def append(self, lease: Lease, records: Sequence[Sequence[Any]]) -> None:
        """Durably add records (one group commit); raises if the lease was superseded."""

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
        """True once a cancel was requested for ``run_id``."""

    def cache_lookup(self, task_names: Iterable[str],
                     exclude_run: str | None = None) -> dict[str, tuple[Any, ...]]:
        """Map fingerprint -> (run_id, task_key, hash, kind, data, uri, size) of committed
        results of these tasks (``exclude_run``: a run being resumed keeps its own)."""

    def lineage(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        """Lineage rows (direction, uri, content hash, attempt, code version)."""

    def notices(self, run_id: str) -> list[dict[str, Any]]:
        """Rejected late or duplicate results and other notes for a run."""

    def attempts(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        """One row per finished attempt."""

    def close(self) -> None:
        """Release files and connections."""
