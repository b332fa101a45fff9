"""The read side every ledger shares: the record reads written once over a store's primitives.

Every store keeps the same journal records (:mod:`ledgerflow.records`) and
answers the same reads: "the rows of one record kind, folded plus the
unfolded tail, filtered by task and attempt". :class:`RecordReads` writes
those reads once (``notices``, ``attempts``, ``events``, ``logs``,
``steps``, ``model_calls``, ``tool_calls``, ``approvals``,
``approval_decisions``, ``lineage``, ``cache_lookup`` and the result-file
calls); a store inherits it and supplies the primitives:

* ``_kind_rows(run_id, kind, *, task_key=None, attempt=None)``: the records of
  one kind in the order written (``RunNotFoundError`` if the run is unknown);
* ``get_run(run_id)``: the run view (the protocol's own read);
* ``_side_decisions(run_id)``: approval decisions made by any process and not
  journaled yet (decision files, a ``signals`` table, a dict);
* ``_cache_read(names, exclude_run, limit)``: the cache entries (a mapping), or only
  the fingerprints when more than ``limit`` results would be read;
* ``blobs``: the store's result files (:mod:`ledgerflow.blobs`).

The SQL ledgers also share the two queries of tables shaped by the records
(:func:`record_rows`, :class:`CacheSQL`), each store naming its dialect.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from .records import (
    ApprovalDecided,
    ApprovalRequested,
    ArtifactRecorded,
    AttemptEnded,
    LogRecorded,
    ModelCall,
    Notice,
    Record,
    StepRecorded,
    ToolCall,
    Transition,
    columns,
    field_types,
)
from .results import Encoded
from .store import CacheHit, CacheIndex, reading
from .views import (
    RunView,
    approval_rows,
    attempt_dict,
    decision_dict,
    event_dict,
    lineage_rows,
    log_dict,
    notice_dict,
    step_dict,
)

R = TypeVar("R", bound=Record)


class RecordReads:
    """The reads of a ledger written once (see the module docstring for the primitives)."""

    #: Cache entries read when a run starts, at most; beyond, the fingerprints alone
    #: (the entries on the first hit: see :class:`ledgerflow.store.CacheIndex`).
    cache_entries_at_start = 5000

    blobs: Any

    # -- the primitives a store supplies -------------------------------------------------
    def _kind_rows(self, run_id: str, kind: type[R], *, task_key: str | None = None,
                   attempt: int | None = None) -> list[R]:
        raise NotImplementedError

    def _side_decisions(self, run_id: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _cache_read(self, names: list[str], exclude_run: str | None,
                    limit: int | None) -> Mapping[str, CacheHit] | set[str]:
        raise NotImplementedError

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        raise NotImplementedError

    def settle(self, run_id: str | None = None) -> None:
        """Wait until the store's own tables hold what this process committed (of
        ``run_id``, or of every run); a store whose tables this process does not fold
        behind a run has nothing to wait for. Reads through the store never need it."""

    # -- record reads --------------------------------------------------------------------
    def notices(self, run_id: str) -> list[dict[str, Any]]:
        return [notice_dict(r) for r in self._kind_rows(run_id, Notice)]

    def attempts(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        return [attempt_dict(r) for r in self._kind_rows(run_id, AttemptEnded,
                                                         task_key=task_key)]

    def events(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        return [event_dict(r) for r in self._kind_rows(run_id, Transition, task_key=task_key)]

    def logs(self, run_id: str, task_key: str | None = None,
             attempt: int | None = None) -> list[dict[str, Any]]:
        return [log_dict(r) for r in self._kind_rows(run_id, LogRecorded, task_key=task_key,
                                                     attempt=attempt)]

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        return [step_dict(r) for r in self._kind_rows(run_id, StepRecorded)]

    def model_calls(self, run_id: str) -> list[dict[str, Any]]:
        return [msgspec.structs.asdict(r) for r in self._kind_rows(run_id, ModelCall)]

    def tool_calls(self, run_id: str) -> list[dict[str, Any]]:
        return [msgspec.structs.asdict(r) for r in self._kind_rows(run_id, ToolCall)]

    def approval_decisions(self, run_id: str) -> list[dict[str, Any]]:
        """Every decision of the run: the side decisions (made by any process), then the
        journaled ones the side does not hold."""
        out = self._side_decisions(run_id)
        seen = {d["digest"] for d in out}
        return out + [decision_dict(r) for r in self._kind_rows(run_id, ApprovalDecided)
                      if r.digest not in seen]

    def approvals(self, run_id: str) -> list[dict[str, Any]]:
        with reading(self):
            return approval_rows(self._kind_rows(run_id, ApprovalRequested),
                                 self.approval_decisions(run_id))

    def lineage(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        """Lineage rows: artifacts, approvals, and every model and tool call."""
        with reading(self):
            view = self.get_run(run_id)
            return lineage_rows(view, self._kind_rows(run_id, ArtifactRecorded), task_key,
                                self.approvals(run_id),
                                self.model_calls(run_id) + self.tool_calls(run_id))

    def cache_lookup(self, task_names: Iterable[str],
                     exclude_run: str | None = None) -> Mapping[str, CacheHit]:
        names = list(task_names)
        found = self._cache_read(names, exclude_run, self.cache_entries_at_start)
        if isinstance(found, set):
            return CacheIndex(found, lambda: self._cache_entries(names, exclude_run))
        return found

    def _cache_entries(self, names: list[str],
                       exclude_run: str | None) -> Mapping[str, CacheHit]:
        found = self._cache_read(names, exclude_run, None)
        assert not isinstance(found, set)
        return found

    # -- result files --------------------------------------------------------------------
    def put_blob(self, enc: Encoded) -> str | None:
        return self.blobs.put(enc)  # type: ignore[no-any-return]

    def read_blob(self, kind: str, data: str | None, uri: str | None) -> Any:
        return self.blobs.read(kind, data, uri)

    def blob_exists(self, uri: str) -> bool:
        return bool(self.blobs.exists(uri))

    def result_path(self, uri: str) -> str:
        """The file behind a result URI (Parquet for tables: ``read_parquet`` it)."""
        return str(self.blobs.path(uri))


def matching(records: Iterable[Any], kind: type[R], task_key: str | None = None,
             attempt: int | None = None) -> list[R]:
    """The records of exactly ``kind`` in ``records``, of ``task_key`` and ``attempt``
    where given (the filter a store applies to its unfolded tail, read or kept one record
    a row: :func:`ledgerflow.records.expand`)."""
    return [r for r in records if type(r) is kind
            and (task_key is None or getattr(r, "task_key", None) == task_key)
            and (attempt is None or getattr(r, "attempt", None) == attempt)]


# -- the SQL ledgers' shared queries ------------------------------------------------------
def _json_fields(kind: type[Record]) -> list[int]:
    """Positions of the fields kept as JSON text (dicts)."""
    hints = field_types(kind)
    return [i for i, c in enumerate(columns(kind))
            if (typing.get_origin(hints[c]) or hints[c]) is dict]


def record_rows(con: Any, run_id: str, kind: type[R], *, mark: str,
                order: Callable[[type[Record]], str], task_key: str | None = None,
                attempt: int | None = None, source: str | None = None) -> list[R]:
    """The folded rows of an append-only record kind, as records, in the order written.

    ``mark`` is the dialect's parameter marker (``?``, ``%s``); ``order(kind)`` the
    column the rows are in write order by; ``source``: what to read them from, if not
    the kind's table (a store's own query of its rows with their order).
    """
    if con is None or kind.TABLE is None:
        return []
    cols = ", ".join(f'"{c}"' for c in columns(kind))
    sql = f"SELECT {cols} FROM {source or kind.TABLE} WHERE run_id = {mark}"
    params: list[Any] = [run_id]
    if task_key is not None:
        sql += f" AND task_key = {mark}"
        params.append(task_key)
    if attempt is not None:
        sql += f" AND attempt = {mark}"
        params.append(attempt)
    as_json = _json_fields(kind)
    out = []
    for row in con.execute(f"{sql} ORDER BY {order(kind)}", params).fetchall():
        if as_json:
            row = list(row)
            for i in as_json:
                row[i] = json.loads(row[i]) if isinstance(row[i], str) else (row[i] or {})
        out.append(kind(*row))
    return out


class CacheSQL:
    """The cache index's queries over a ``tasks`` table, in one SQL dialect.

    Args:
        names_filter: the condition on ``task_name`` (the names, one list
            parameter) and ``run_id`` (the run left out, a second one).
    """

    def __init__(self, names_filter: str) -> None:
        self.source = ("FROM tasks WHERE state = 'succeeded' AND fingerprint IS NOT NULL "
                       f"AND {names_filter}")

    def read(self, con: Any, names: list[str], exclude_run: str | None,
             limit: int | None) -> dict[str, CacheHit] | set[str]:
        """One committed result per fingerprint (the newest run's) of tasks named
        ``names``; only the fingerprints when more than ``limit`` results qualify (a
        count is a few ms where the entries of 100,000 take ~0.2 s)."""
        if con is None or not names:
            return {}
        params = [names, exclude_run]
        if limit is not None and int(con.execute(f"SELECT count(*) {self.source}",
                                                 params).fetchone()[0]) > limit:
            return {fp for (fp,) in con.execute(f"SELECT DISTINCT fingerprint {self.source}",
                                                 params).fetchall()}
        # the index grows with the distinct work done, not with how many times it was re-run
        rows = con.execute(
            "SELECT DISTINCT ON (fingerprint) fingerprint, run_id, task_key, result_hash, "
            f"result_kind, result_data, result_uri, result_size {self.source} "
            "ORDER BY fingerprint, run_id DESC", params).fetchall()
        return {fp: tuple(rest) for fp, *rest in rows}
