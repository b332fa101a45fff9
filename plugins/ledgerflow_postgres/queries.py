"""Reads of the ledger's tables: a run, the run listing, the cache index, record rows.

Every function takes an open connection and returns plain read models
(:class:`~ledgerflow.views.RunView`, records); what the store adds (driver
liveness) is done in :mod:`ledgerflow_postgres.store`.
"""

from __future__ import annotations

import json
from typing import Any

from ledgerflow.records import (
    KINDS,
    AnyRecord,
    Record,
    columns,
    decode_line,
    field_types,
)
from ledgerflow.store import CacheHit
from ledgerflow.views import RunView, TaskRow

from .sql import RUN_FIELDS, TASK_COLUMNS

_RUN_SQL = ("SELECT " + ", ".join(f'r."{c}"' for c in RUN_FIELDS) +
            ", l.expires_at > now(), l.pid, l.host, l.pid_start "
            "FROM runs r LEFT JOIN leases l USING (run_id) WHERE r.run_id = %s")


def load_run(con: Any, run_id: str, *, tasks: bool = True,
             upstream: bool = True) -> tuple[RunView, tuple[Any, ...]] | None:
    """The run's rows and its lease ``(unexpired, pid, host, pid_start)`` (None: no run)."""
    row = con.execute(_RUN_SQL, [run_id]).fetchone()
    if row is None:
        return None
    n = len(RUN_FIELDS)
    values = dict(zip(RUN_FIELDS, row[:n], strict=True))
    for f, default in (("params", "{}"), ("options", "{}"), ("reason", ""),
                       ("created_at", 0.0), ("token", 0), ("max_seq", 0)):
        if values[f] is None:
            values[f] = default
    view = RunView(**values)
    if tasks:
        cols = ", ".join(
            ("upstream" if upstream else "NULL") if c == "upstream" else f'"{c}"'
            for c in TASK_COLUMNS)
        for r in con.execute(f"SELECT {cols} FROM tasks WHERE run_id = %s ORDER BY ord",
                             [run_id]):
            t = TaskRow(*r)
            t.upstream = list(t.upstream or ())
            view.tasks[t.key] = t
    return view, tuple(row[n:])


def tail(con: Any, run_id: str) -> list[tuple[int, int, list[AnyRecord]]]:
    """The run's commits not folded into the tables yet: ``(token, seq, records)``, in order."""
    return tail_from(con, run_id, folded_to(con, run_id))


def tail_from(con: Any, run_id: str, after: tuple[int, int]
              ) -> list[tuple[int, int, list[AnyRecord]]]:
    """The run's commits after ``(token, seq)``, in order."""
    # a row comparison on a prefix of the primary key: an index range scan
    rows = con.execute(
        "SELECT token, seq, body FROM commits WHERE run_id = %s "
        "AND (run_id, token, seq) > (%s, %s, %s) ORDER BY token, seq",
        [run_id, run_id, *after]).fetchall()
    return [(t, s, decode_line(body.encode())) for t, s, body in rows]


def folded_to(con: Any, run_id: str) -> tuple[int, int]:
    """Up to which commit ``(token, seq)`` the run is folded ((0, 0): none)."""
    row = con.execute("SELECT token, seq FROM folds WHERE run_id = %s", [run_id]).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def next_ord(con: Any, run_id: str) -> int:
    """The creation order the run's next new task gets."""
    row = con.execute("SELECT coalesce(max(ord) + 1, 0) FROM tasks WHERE run_id = %s",
                      [run_id]).fetchone()
    return int(row[0])


def has_run(con: Any, run_id: str) -> bool:
    return con.execute("SELECT 1 FROM runs WHERE run_id = %s", [run_id]).fetchone() is not None


def list_runs(con: Any, limit: int) -> list[tuple[RunView, tuple[Any, ...]]]:
    """The newest ``limit`` runs with task counts by state (no task rows), and leases."""
    rows = con.execute(
        "SELECT r.run_id, r.pipeline, r.state, r.reason, r.created_at, r.ended_at, r.target, "
        "r.params, r.options, l.expires_at > now(), l.pid, l.host, l.pid_start "
        "FROM runs r LEFT JOIN leases l USING (run_id) "
        "ORDER BY r.created_at DESC LIMIT %s", [limit]).fetchall()
    counts = con.execute(
        "SELECT run_id, state, count(*) FROM tasks WHERE run_id = ANY(%s) "
        "GROUP BY run_id, state", [[r[0] for r in rows]]).fetchall()
    out: dict[str, tuple[RunView, tuple[Any, ...]]] = {}
    for rid, pipe, state, reason, created, ended, target, params, opts, *lease in rows:
        out[rid] = (RunView(rid, pipeline=pipe, state=state, reason=reason or "",
                            created_at=created or 0.0, ended_at=ended, target=target,
                            params=params or "{}", options=opts or "{}", task_counts={}),
                    tuple(lease))
    for rid, state, n in counts:
        out[rid][0].task_counts[state] = n  # type: ignore[index]
    return list(out.values())


_CACHED = ("FROM tasks WHERE state = 'succeeded' AND fingerprint IS NOT NULL "
           "AND task_name = ANY(%s) AND run_id IS DISTINCT FROM %s")


def cache_lookup(con: Any, names: list[str], exclude_run: str | None) -> dict[str, CacheHit]:
    """One committed result per fingerprint (the newest run's) of tasks named ``names``."""
    if not names:
        return {}
    rows = con.execute(
        "SELECT DISTINCT ON (fingerprint) fingerprint, run_id, task_key, result_hash, "
        f"result_kind, result_data, result_uri, result_size {_CACHED} "
        "ORDER BY fingerprint, run_id DESC", [names, exclude_run]).fetchall()
    return {fp: tuple(rest) for fp, *rest in rows}


def cached_count(con: Any, names: list[str], exclude_run: str | None) -> int:
    """How many committed results :func:`cache_lookup` chooses from."""
    if not names:
        return 0
    return int(con.execute(f"SELECT count(*) {_CACHED}", [names, exclude_run]).fetchone()[0])


def cached_fingerprints(con: Any, names: list[str], exclude_run: str | None) -> set[str]:
    """The fingerprints :func:`cache_lookup` would map (without their entries)."""
    return {fp for (fp,) in con.execute(f"SELECT DISTINCT fingerprint {_CACHED}",
                                         [names, exclude_run]).fetchall()}


def _select(kind: type[Record]) -> str:
    cols = ", ".join(f'"{c}"' for c in columns(kind))
    return f"SELECT {cols} FROM {kind.TABLE} WHERE run_id = %s"


_RECORD_SQL: dict[type[Record], str] = {
    kind: _select(kind) for kind in KINDS.values() if kind.TABLE}


def _json_fields(kind: type[Record]) -> list[int]:
    """Positions of the fields kept as JSON text (dicts)."""
    hints = field_types(kind)
    return [i for i, c in enumerate(columns(kind))
            if (getattr(hints[c], "__origin__", None) or hints[c]) is dict]


def record_rows(con: Any, run_id: str, kind: type[Record], *, task_key: str | None = None,
                attempt: int | None = None) -> list[Any]:
    """The rows of an append-only record kind, as records, in the order written."""
    sql = _RECORD_SQL[kind]
    params: list[Any] = [run_id]
    if task_key is not None:
        sql += " AND task_key = %s"
        params.append(task_key)
    if attempt is not None:
        sql += " AND attempt = %s"
        params.append(attempt)
    out = []
    as_json = _json_fields(kind)
    order = "seq" if "seq" in columns(kind) and kind.TABLE == "events" else "id"
    for row in con.execute(f"{sql} ORDER BY {order}", params):
        if as_json:
            row = list(row)
            for i in as_json:
                row[i] = json.loads(row[i]) if isinstance(row[i], str) else (row[i] or {})
        out.append(kind(*row))
    return out
