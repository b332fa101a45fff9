"""Reads of the ledger's tables: a run, the run listing, the cache index, record rows.

Every function takes an open connection and returns plain read models
(:class:`~ledgerflow.views.RunView`, records); what the store adds (driver
liveness) is done in :mod:`ledgerflow_postgres.store`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ledgerflow import ledger
from ledgerflow.errors import NotResumableError
from ledgerflow.ledger import CacheSQL
from ledgerflow.records import AnyRecord, Record, decode_line
from ledgerflow.views import RunView, TaskRow

from .sql import RUN_FIELDS, TASK_COLUMNS

R = TypeVar("R", bound=Record)

_RUN_SQL = ("SELECT " + ", ".join(f'r."{c}"' for c in RUN_FIELDS) +
            ", l.expires_at > now(), l.pid, l.host, l.pid_start, l.token "
            "FROM runs r LEFT JOIN leases l USING (run_id) WHERE r.run_id = %s")


def load_run(con: Any, run_id: str, *, tasks: bool = True,
             upstream: bool = True) -> tuple[RunView, tuple[Any, ...]] | None:
    """The run's rows and its lease ``(unexpired, pid, host, pid_start, token)`` (None: no
    run)."""
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


#: The cache index's queries (:class:`ledgerflow.ledger.CacheSQL`) in PostgreSQL's dialect.
CACHED = CacheSQL("task_name = ANY(%s) AND run_id IS DISTINCT FROM %s")


def _order(kind: type[Record]) -> str:
    return "seq" if kind.TABLE == "events" else "id"


def record_rows(con: Any, run_id: str, kind: type[R], *, task_key: str | None = None,
                attempt: int | None = None) -> list[R]:
    """The rows of an append-only record kind, as records, in the order written."""
    return ledger.record_rows(con, run_id, kind, mark="%s", order=_order,
                              task_key=task_key, attempt=attempt)


def resumed_meanwhile(con: Any, run_id: str) -> NotResumableError:
    """The refusal of a takeover of a run another driver took over (and maybe finished)
    since this process read it: the read is stale, so the run is not driven from it."""
    row = con.execute("SELECT l.pid, l.host, r.state FROM leases l JOIN runs r "
                      "USING (run_id) WHERE run_id = %s", [run_id]).fetchone()
    pid, host, state = row if row is not None else (None, None, "unknown")
    return NotResumableError(
        f"run {run_id} is being resumed by pid {pid} on {host} (or was, since this resume "
        f"read it: it is {state} now)", hint=f"see it with: pipeline status {run_id}")
