"""Reads of the ledger's tables: a run, the run listing, the cache index, record rows.

Every function takes an open connection (or None when the file does not
exist yet) and returns plain read models; combining them with the journal
tail is the store's job (:mod:`ledgerflow_stores.duckdb.store`).
"""

from __future__ import annotations

from itertools import starmap
from typing import Any, TypeVar

from ledgerflow import ledger
from ledgerflow.ledger import CacheSQL
from ledgerflow.records import AttemptEnded, Record
from ledgerflow.views import RunView, TaskRow

from . import schema

R = TypeVar("R", bound=Record)
Folded = dict[int, int]      # token -> journal offset folded


def folded_offsets(con: Any, run_id: str) -> Folded:
    if con is None:
        return {}
    return dict(con.execute('SELECT token, "offset" FROM journal_folds WHERE run_id = ?',
                            [run_id]).fetchall())


#: The tasks a resume always keeps as they are: successes whose result is in the row.
SETTLED = "state = 'succeeded' AND result_uri IS NULL"


def load_run(con: Any, run_id: str, *, tasks: bool = True, upstream: bool = True,
             unsettled: bool = False) -> RunView | None:
    """The run's folded rows (None if the tables do not hold it); ``unsettled``: only
    the tasks that are not :data:`SETTLED`."""
    if con is None:
        return None
    row = con.execute(
        "SELECT pipeline, target, params, options, created_at, state, reason, ended_at, "
        "token, max_seq, driver_pid, driver_host FROM runs WHERE run_id = ?",
        [run_id]).fetchall()
    if not row:
        return None
    (pipeline, target, params, options, created, state, reason, ended, token, max_seq,
     pid, host) = row[0]
    view = RunView(run_id, pipeline=pipeline, target=target, params=params or "{}",
                   options=options or "{}", created_at=created or 0.0, state=state,
                   reason=reason or "", ended_at=ended, token=token or 0,
                   max_seq=max_seq or 0, driver_pid=pid, driver_host=host)
    if not tasks:
        return view
    view.tasks.update(_task_rows(con, run_id, f"AND NOT ({SETTLED}) " if unsettled else "",
                                 upstream=upstream))
    return view


def task_rows(con: Any, run_id: str, keys: list[str],
              rowids: dict[str, int] | None = None) -> dict[str, TaskRow]:
    """The rows of the run's tasks ``keys`` (those the tables hold), without upstreams;
    with ``rowids``, each row's rowid is put there by key (its place in the table)."""
    return _task_rows(con, run_id, "AND task_key IN (SELECT unnest(?::VARCHAR[])) ",
                      [keys], upstream=False, rowids=rowids)


def _task_rows(con: Any, run_id: str, where: str, args: list[Any] | None = None, *,
               upstream: bool, rowids: dict[str, int] | None = None) -> dict[str, TaskRow]:
    # upstream lists are the costliest column to turn into Python: only lineage needs them
    ups = "coalesce(upstream, [])" if upstream else "[]::VARCHAR[]"
    # the columns in TaskRow's order, NULLs already replaced: a row is TaskRow(*row)
    rows = con.execute(
        f"SELECT task_key, task_name, node, item_key, position, {ups}, code_version, state, "
        "coalesce(attempts, 0), coalesce(budget_base, 0), started_at, ended_at, error, "
        "fingerprint, result_hash, result_kind, result_data, result_uri, "
        "coalesce(result_size, 0), cached_from, coalesce(result_attempt, 0)"
        f"{', rowid' if rowids is not None else ''} "
        f"FROM tasks WHERE run_id = ? {where}ORDER BY rowid", [run_id, *(args or [])]
    ).fetchall()
    if rowids is not None:
        rowids.update((r[0], r[-1]) for r in rows)
        rows = [r[:-1] for r in rows]
    return dict(zip([r[0] for r in rows], starmap(TaskRow, rows), strict=True))


def has_signals(con: Any, run_id: str) -> bool:
    """True if the run's tables hold an approval request or a step (a decision needs a
    request: without either, a resume has no gate or step to load)."""
    return bool(con.execute(
        "SELECT EXISTS (SELECT 1 FROM approval_requests WHERE run_id = $1) "
        "OR EXISTS (SELECT 1 FROM steps WHERE run_id = $1)", [run_id]).fetchone()[0])


def settled_keys(con: Any, run_id: str) -> frozenset[str]:
    """The keys of the run's :data:`SETTLED` tasks (a frontier resume keeps them)."""
    return frozenset([k for (k,) in con.execute(
        f"SELECT task_key FROM tasks WHERE run_id = ? AND {SETTLED}", [run_id]).fetchall()])


def damage(con: Any, run_id: str) -> list[str]:
    """What the fold found damaged in the run's journals, in plain words."""
    if con is None:
        return []
    return [f"journal {run_id}.{token}.jsonl is damaged at byte {offset}: {reason}"
            for token, offset, reason in con.execute(
                'SELECT token, "offset", reason FROM journal_damage WHERE run_id = ? '
                "ORDER BY token", [run_id]).fetchall()]


def has_run(con: Any, run_id: str) -> bool:
    if con is None:
        return False
    return bool(con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchall())


def list_runs(con: Any, limit: int) -> dict[str, RunView]:
    """The newest ``limit`` folded runs, with task counts by state (no task rows)."""
    views: dict[str, RunView] = {}
    if con is None:
        return views
    rows = con.execute(
        "SELECT run_id, pipeline, state, reason, created_at, ended_at, target, "
        "params, options FROM runs ORDER BY created_at DESC LIMIT ?", [limit]).fetchall()
    counts = con.execute(
        "SELECT run_id, state, count(*) FROM tasks WHERE run_id IN "
        "(SELECT run_id FROM runs ORDER BY created_at DESC LIMIT ?) "
        "GROUP BY ALL", [limit]).fetchall()
    for rid, pipe, state, reason, created, ended, target, params, opts in rows:
        views[rid] = RunView(rid, pipeline=pipe, state=state, reason=reason or "",
                             created_at=created or 0.0, ended_at=ended, target=target,
                             params=params or "{}", options=opts or "{}", task_counts={})
    for rid, state, n in counts:
        views[rid].task_counts[state] = n  # type: ignore[index]
    return views


#: The cache index's queries (:class:`ledgerflow.ledger.CacheSQL`) in DuckDB's dialect.
CACHED = CacheSQL("task_name IN (SELECT unnest($1::VARCHAR[])) "
                  "AND run_id IS DISTINCT FROM $2")


def record_rows(con: Any, run_id: str, kind: type[R], *, task_key: str | None = None,
                attempt: int | None = None) -> list[R]:
    """The folded rows of an append-only record kind, as records (in their order: events
    by ``seq``, which the fold does not keep in row order; attempts as
    :data:`.schema.ATTEMPTS_IN_ORDER` places them; results, a view of two tables that no
    reader needs in write order, by attempt)."""
    return ledger.record_rows(con, run_id, kind, mark="?",
                              order=lambda k: _ORDER.get(k.TABLE or "", "rowid"),
                              task_key=task_key, attempt=attempt,
                              source=schema.ATTEMPTS_IN_ORDER if kind is AttemptEnded else None)


#: The order of a view's rows (a table's are in write order by ``rowid``).
_ORDER = {"events": "seq", "results": "attempt", "attempts": "_after NULLS FIRST, _kept, _row"}
