"""The ``memory`` store: the ledger as Python objects, for tests and notebooks.

Nothing survives the process. Select it with ``store=":memory:"`` (or any
``memory:NAME``); one store per name per process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ledgerflow import hookimpl
from ledgerflow.config import Settings
from ledgerflow.errors import LeaseLostError, NotResumableError, RunNotFoundError
from ledgerflow.results import Encoded, decode
from ledgerflow.store import Lease, RunView, apply


class MemoryStore:
    """A run store kept in this process's memory."""

    name = "memory"

    def __init__(self, location: str = ":memory:") -> None:
        self.location = location
        self._lock = threading.Lock()
        self._created: dict[str, float] = {}
        self._records: dict[str, list[Sequence[Any]]] = {}
        self._tokens: dict[str, int] = {}
        self._held: set[str] = set()
        self._cancel: set[str] = set()
        self._blobs: dict[str, bytes] = {}
        self._indexes: dict[str, dict[str, tuple[str, tuple[Any, ...]]]] = {}

    def create_run(self, run_id: str, records: Sequence[Sequence[Any]]) -> Lease:
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
            self._cancel.discard(run_id)
        return Lease(run_id, token)

    def append(self, lease: Lease, records: Sequence[Sequence[Any]]) -> None:
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

    def put_blob(self, enc: Encoded) -> str | None:
        if enc.kind == "json" and enc.size <= 65536:
            return None
        uri = f"memory://{enc.hash}.{enc.kind}"
        self._blobs[uri] = enc.data
        return uri

    def read_blob(self, kind: str, data: str | None, uri: str | None) -> Any:
        if uri is not None:
            return decode(kind, self._blobs[uri])
        return decode(kind, (data or "null").encode())

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        with self._lock:
            records = self._records.get(run_id)
            if records is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            if not tasks:
                records = [r for r in records if r[0] in ("D", "H", "S")]
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

    def cache_lookup(self, task_names: Iterable[str],
                     exclude_run: str | None = None) -> dict[str, tuple[Any, ...]]:
        names = set(task_names)
        out: dict[str, tuple[Any, ...]] = {}
        for run_id in reversed(list(self._records)):      # newest run first
            if run_id == exclude_run:
                continue
            for fp, (name, hit) in self._successes(run_id).items():
                if name in names:
                    out.setdefault(fp, hit)
        return out

    def _successes(self, run_id: str) -> dict[str, tuple[str, tuple[Any, ...]]]:
        """fingerprint -> (task name, cache hit) of a run; kept once the run is idle."""
        index = self._indexes.get(run_id)
        if index is not None:
            return index
        index = {}
        for row in self.get_run(run_id).tasks.values():
            if row.state == "succeeded" and row.fingerprint:
                index.setdefault(row.fingerprint, (row.task_name, (
                    run_id, row.key, row.result_hash, row.result_kind, row.result_data,
                    row.result_uri, row.result_size)))
        with self._lock:
            if run_id not in self._held:    # a driven run changes; an idle one does not
                self._indexes[run_id] = index
        return index

    def _rows(self, run_id: str, kind: str) -> list[Sequence[Any]]:
        self.get_run(run_id)
        return [r for r in self._records[run_id] if r[0] == kind]

    def lineage(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        view = self.get_run(run_id)
        return lineage_rows(view, self._rows(run_id, "L"), task_key)

    def notices(self, run_id: str) -> list[dict[str, Any]]:
        return [{"task_key": r[1], "attempt": r[2], "kind": r[3], "message": r[4], "at": r[5]}
                for r in self._rows(run_id, "N")]

    def attempts(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        return [attempt_dict(r) for r in self._rows(run_id, "A")
                if task_key is None or r[1] == task_key]

    def close(self) -> None:
        return None


def attempt_dict(r: Sequence[Any]) -> dict[str, Any]:
    """An ``A`` record as a dict."""
    return {"task_key": r[1], "attempt": r[2], "outcome": r[3], "started_at": r[4],
            "ended_at": r[5], "error_type": r[6], "error_message": r[7]}


def lineage_rows(view: RunView, artifacts: Iterable[Sequence[Any]],
                 task_key: str | None) -> list[dict[str, Any]]:
    """Upstream results read, the result produced, and recorded artifacts."""
    out: list[dict[str, Any]] = []
    children: dict[str, list[Any]] = {}
    for row in view.tasks.values():
        if row.position is not None:
            children.setdefault(row.node, []).append(row)
    for row in view.tasks.values():
        if task_key is not None and row.key != task_key:
            continue
        for up in row.upstream:
            # an upstream fan-out stands for all its children, in item order
            srcs = [view.tasks[up]] if up in view.tasks else sorted(
                children.get(up, []), key=lambda r: r.position or 0)
            for src in srcs:
                out.append({"task_key": row.key, "attempt": row.result_attempt,
                            "direction": "input", "uri": f"task:{src.key}",
                            "content_hash": src.result_hash,
                            "code_version": row.code_version, "attrs": {}})
        if row.state == "succeeded":
            out.append({"task_key": row.key, "attempt": row.result_attempt,
                        "direction": "output", "uri": f"task:{row.key}",
                        "content_hash": row.result_hash, "code_version": row.code_version,
                        "attrs": {"cached_from": row.cached_from} if row.cached_from else {}})
    for r in artifacts:
        if task_key is None or r[1] == task_key:
            src = view.tasks.get(r[1])
            out.append({"task_key": r[1], "attempt": r[2], "direction": r[3], "uri": r[4],
                        "content_hash": r[5], "code_version": src.code_version if src else None,
                        "attrs": r[6] or {}})
    return out


@hookimpl
def ledgerflow_store_names() -> list[str]:
    return ["memory"]


@hookimpl
def ledgerflow_make_store(name: str, settings: Settings) -> MemoryStore | None:
    if name != "memory":
        return None
    return MemoryStore(settings.store)
