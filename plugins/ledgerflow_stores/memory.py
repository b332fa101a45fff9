"""The ``memory`` store: the ledger as Python objects, for tests and notebooks.

Nothing survives the process. Select it with ``store=":memory:"`` (or any
``memory:NAME``); one store per name per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ledgerflow import hookimpl
from ledgerflow.blobs import MemoryBlobs
from ledgerflow.config import Settings
from ledgerflow.errors import (
    ApprovalConflictError,
    LeaseLostError,
    NotResumableError,
    RunNotFoundError,
)
from ledgerflow.ledger import RecordReads, matching
from ledgerflow.projection import apply
from ledgerflow.records import RUN_KINDS, Record, expand
from ledgerflow.states import TaskState
from ledgerflow.store import CacheHit, Lease
from ledgerflow.views import RunView

from .memory_index import Hits, MergedIndex, Successes

R = TypeVar("R", bound=Record)


class MemoryStore(RecordReads):
    """A run store kept in this process's memory."""

    name = "memory"

    def __init__(self, location: str = ":memory:") -> None:
        self.location = location
        self._lock = threading.Lock()
        self._created: dict[str, float] = {}
        self._records: dict[str, list[Record]] = {}
        self._tokens: dict[str, int] = {}
        self._held: set[str] = set()
        self._cancel: set[str] = set()
        self.blobs = MemoryBlobs(inline_limit=65536)
        self._indexes: dict[str, Successes] = {}
        self._merged = MergedIndex()        # the idle runs' successes, for cache lookups
        self._merging = threading.Lock()
        self._decisions: dict[str, dict[str, dict[str, Any]]] = {}

    def create_run(self, run_id: str, records: Sequence[Record]) -> Lease:
        with self._lock:
            self._created[run_id] = apply(RunView(run_id), records).created_at
            self._records[run_id] = list(records)
            self._tokens[run_id] = 1
            self._held.add(run_id)
        return Lease(run_id, 1)

    def take_over(self, run_id: str) -> Lease:
        with self._lock:
            if run_id not in self._records:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            if run_id in self._held:
                raise NotResumableError(f"run {run_id} is still being driven in this process",
                                        hint="wait for it, or cancel it first")
            token = self._tokens[run_id] + 1
            self._tokens[run_id] = token
            self._held.add(run_id)
            self._indexes.pop(run_id, None)
            self._merged.forget(run_id)
            self._cancel.discard(run_id)
        return Lease(run_id, token)

    def append(self, lease: Lease, records: Sequence[Record]) -> None:
        with self._lock:
            if self._tokens.get(lease.run_id) != lease.token:
                raise LeaseLostError(f"run {lease.run_id} was taken over (token "
                                     f"{lease.token} < {self._tokens.get(lease.run_id)})")
            # a commit is the append; views are folded from the records when read
            self._records[lease.run_id].extend(records)

    def release(self, lease: Lease) -> None:
        with self._lock:
            if self._tokens.get(lease.run_id) == lease.token:
                self._held.discard(lease.run_id)

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        with self._lock:
            records = self._records.get(run_id)
            if records is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            if not tasks:
                records = [r for r in records if isinstance(r, RUN_KINDS)]
            copy = apply(RunView(run_id), records)
        copy.driver_alive = run_id in self._held
        return copy

    def list_runs(self, limit: int = 50) -> list[RunView]:
        ids = sorted(self._created, key=lambda r: self._created[r], reverse=True)
        return [self.get_run(r) for r in ids[:limit]]

    def request_cancel(self, run_id: str) -> None:
        self.get_run(run_id)
        self._cancel.add(run_id)

    def cancel_requested(self, run_id: str) -> bool:
        return run_id in self._cancel

    def _cache_read(self, names: list[str], exclude_run: str | None,
                    limit: int | None) -> Hits:
        """A view of the entries (in memory already: never only the fingerprints): the
        idle runs' successes merged once (:mod:`.memory_index`), the driven runs' read now."""
        wanted = set(names)
        live: list[tuple[int, Successes]] = []
        with self._merging:
            runs = list(self._records)
            for order in range(len(runs) - 1, -1, -1):      # newest run first
                run_id = runs[order]
                if run_id in self._held:
                    live.append((order, self._successes(run_id)))
                elif run_id not in self._merged.merged:
                    self._merged.add(run_id, order, self._successes(run_id))
        return Hits(self._merged, wanted, exclude_run, live,
                    lambda: self._scan(wanted, exclude_run))

    def _scan(self, wanted: set[str], exclude_run: str | None) -> dict[str, CacheHit]:
        """Every entry of a wanted task, the newest run's per fingerprint (read run by run)."""
        out: dict[str, CacheHit] = {}
        for run_id in reversed(list(self._records)):      # newest run first
            if run_id == exclude_run:
                continue
            for fp, (name, hit) in self._successes(run_id).items():
                if name in wanted:
                    out.setdefault(fp, hit)
        return out

    def _successes(self, run_id: str) -> Successes:
        """fingerprint -> (task name, cache hit) of a run; kept once the run is idle."""
        index = self._indexes.get(run_id)
        if index is not None:
            return index
        index = {}
        for row in self.get_run(run_id).tasks.values():
            if row.state == TaskState.SUCCEEDED and row.fingerprint:
                index.setdefault(row.fingerprint, (row.task_name, (
                    run_id, row.key, row.result_hash or "", row.result_kind or "json", row.result_data,
                    row.result_uri, row.result_size)))
        with self._lock:
            if run_id not in self._held:    # a driven run changes; an idle one does not
                self._indexes[run_id] = index
        return index

    def _kind_rows(self, run_id: str, kind: type[R], *, task_key: str | None = None,
                   attempt: int | None = None) -> list[R]:
        with self._lock:
            records = self._records.get(run_id)
            if records is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            # kept as the runner wrote them: outcome records stand for several rows
            return matching(expand(records), kind, task_key, attempt)

    def decide(self, run_id: str, task_key: str, digest: str, decision: str, by: str,
               reason: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        self.get_run(run_id, tasks=False)
        with self._lock:
            made = self._decisions.setdefault(run_id, {})
            if digest in made:
                other = made[digest]
                raise ApprovalConflictError(
                    f"the request {digest[:12]} of {task_key} was already "
                    f"{other['decision']} by {other['decided_by']}",
                    hint=f"see it with: pipeline approvals {run_id}")
            made[digest] = doc = {"task_key": task_key, "digest": digest,
                                  "decision": decision, "decided_by": by, "reason": reason,
                                  "decided_at": time.time(),
                                  **({} if arguments is None else {"arguments": arguments})}
        return doc

    def _side_decisions(self, run_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._decisions.get(run_id, {}).values())

    def worker_folders(self, run_id: str) -> None:
        return None         # nothing on disk: steps live in the records only

    def recover(self) -> None:
        return None         # nothing is derived: reads fold the records themselves

    def doctor(self) -> list[dict[str, Any]]:
        return [{"problem": False, "what": f"memory store {self.location}: "
                 f"{len(self._records)} run(s), nothing kept on disk", "fix": ""}]

    def repair(self) -> tuple[str, list[str]]:
        return "", []

    def close(self) -> None:
        return None


@hookimpl
def ledgerflow_store_names() -> list[str]:
    return ["memory"]


@hookimpl
def ledgerflow_make_store(name: str, settings: Settings) -> MemoryStore | None:
    if name != "memory":
        return None
    return MemoryStore(settings.store)
