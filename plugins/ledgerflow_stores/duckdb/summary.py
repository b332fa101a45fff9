"""A big run summed per task name, for ``pipeline status``: in SQL, with the journal tail on top.

The counts, groups and first failure the status table shows for a run of many
tasks come from one grouped statement over the ``tasks`` table, never a Python
object a task. A live run's journal holds records the tables lack (its tail):
the tasks the tail names are left out of the statement, their rows read by key,
brought up to date by :func:`ledgerflow.projection.apply` and summed here,
with the rest, the same way the statement sums them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerflow.projection import apply
from ledgerflow.records import AnyRecord
from ledgerflow.views import RunView, TaskGroup, TaskRow

from .queries import task_rows

#: Where the tasks a tail creates sort after every row of the table (by creation).
_AFTER_TABLE = 1 << 62
_FAILING = "error <> '' AND state <> 'succeeded'"
#: One row per (name, state): count, cached, busy seconds, the first error by rowid
#: and that rowid, the first rowid, and the failure that ended first.
_GROUPED = (
    "SELECT n, state, count(*), count(nullif(cached_from, '')), "
    "coalesce(sum(ended_at - started_at) FILTER (WHERE started_at > 0 "
    "AND ended_at > 0), 0), "
    f"arg_min(task_key || ': ' || error, rid) FILTER (WHERE {_FAILING}), "
    f"min(rid) FILTER (WHERE {_FAILING}), min(rid), "
    "arg_min(struct_pack(k := task_key, t := task_name, e := error, at := ended_at), "
    "struct_pack(e := coalesce(ended_at, 0), k := task_key)) "
    "FILTER (WHERE state = 'failed') "
    "FROM (SELECT coalesce(nullif(task_name, ''), task_key) AS n, rowid AS rid, * "
    "FROM tasks WHERE run_id = ? {where}) GROUP BY n, state")


def summarize(con: Any, view: RunView, min_tasks: int,
              tail: Sequence[AnyRecord] = ()) -> RunView | None:
    """Fill ``view`` (a run row) with its tasks summed per name, and apply ``tail`` (the
    run's records the tables lack) to it; None if the run has ``min_tasks`` tasks or
    fewer. ``view`` keeps no task rows.

    One grouped statement (a statement costs ~1-2 ms to plan, whatever it reads);
    the per-name figures are summed here."""
    rows: list[tuple[Any, ...]] = []
    where, args = "", []
    if tail:
        named = list(dict.fromkeys(k for r in tail
                                   if (k := getattr(r, "task_key", None)) is not None))
        where, args = "AND task_key NOT IN (SELECT unnest(?::VARCHAR[]))", [named]
        rids: dict[str, int] = {}
        view.tasks.update(task_rows(con, view.run_id, named, rids))
        apply(view, tail)
        rows = [_grouped(row, rids.get(key, _AFTER_TABLE + i))
                for i, (key, row) in enumerate(view.tasks.items())]
        view.tasks.clear()
    rows += con.execute(_GROUPED.format(where=where), [view.run_id, *args]).fetchall()
    if sum(r[2] for r in rows) <= min_tasks:
        return None
    counts: dict[str, int] = {}
    by_name: dict[str, list[Any]] = {}      # name -> [first rowid, count, cached, busy,
    first: dict[str, Any] | None = None     #          (error rowid, error), per state]
    for n, state, c, cached, busy, err, err_at, at, failed in rows:
        counts[state] = counts.get(state, 0) + c
        g = by_name.setdefault(n, [at, 0, 0, 0.0, None, {}])
        g[0] = min(g[0], at)
        g[1] += c
        g[2] += cached
        g[3] += busy
        if err is not None and (g[4] is None or err_at < g[4][0]):
            g[4] = (err_at, err)
        g[5][state] = g[5].get(state, 0) + c
        if failed is not None and (first is None or (failed["at"] or 0, failed["k"]) < (
                first["at"] or 0, first["k"])):
            first = failed
    view.task_counts = counts
    view.groups = [TaskGroup(n, c, per_state, cached, float(busy), err[1] if err else "")
                   for n, (_at, c, cached, busy, err, per_state)
                   in sorted(by_name.items(), key=lambda kv: kv[1][0])]
    if first is not None:
        view.first_failure = TaskRow(first["k"], first["t"], state="failed",
                                     error=first["e"], ended_at=first["at"])
    return view


def _grouped(row: TaskRow, rid: int) -> tuple[Any, ...]:
    """One task as a row of :data:`_GROUPED` (a group of one)."""
    failing = bool(row.error) and row.state != "succeeded"
    timed = (row.started_at or 0) > 0 and (row.ended_at or 0) > 0
    return (row.task_name or row.key, row.state, 1, 1 if row.cached_from else 0,
            (row.ended_at or 0) - (row.started_at or 0) if timed else 0,
            f"{row.key}: {row.error}" if failing else None, rid if failing else None, rid,
            {"k": row.key, "t": row.task_name, "e": row.error, "at": row.ended_at}
            if row.state == "failed" else None)
