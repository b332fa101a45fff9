"""One batch of journal lines into the ledger's tables, set-based: the SQL twin of the projection.

A batch of lines is written out as one JSON array that DuckDB's JSON reader
streams into ``lf_raw`` (one row per record, its fields as text); per record
kind a staging query derived from the record's declaration
(:mod:`ledgerflow.records`: field names are column names) casts them (format
3's outcome records expanded into the rows they stand for: :data:`_EXPANSIONS`,
:func:`ledgerflow.records.expand` in SQL), one
``INSERT ... SELECT`` appends each kind to its table, and one ``UPDATE``
brings ``tasks`` to the current state: the SQL twin of
:func:`ledgerflow.projection.apply`, which the store contract suite keeps
equal. A task created in the batch is inserted in the state the batch leaves it
(:mod:`.taskrows`), and its row keeps the moves of its creation (and, in a batch
without failed attempts, of its one success, with the dispatch that carries, and that
success's result) that ``events`` and ``results`` read (:data:`.schema.EVENTS_VIEW`,
:data:`.schema.RESULTS_VIEW`): they are neither staged in ``lf_e`` nor written as
``event_rows`` and ``result_rows``.
"""

from __future__ import annotations

import functools
import types
import typing
from pathlib import Path
from typing import Any

from ledgerflow import private
from ledgerflow.records import (
    KINDS,
    AttemptEnded,
    Record,
    ResultRecorded,
    Succeeded,
    TaskCreated,
    Transition,
    columns,
    field_types,
)
from ledgerflow.states import RUN_TERMINAL

from .taskrows import last_seq, move_kept_results, task_insert, task_update, touched

RUN_TERMINAL_VALUES = frozenset(s.value for s in RUN_TERMINAL)


def _sql_cast(ann: Any, index: int) -> str:
    """The SQL that reads field ``index`` (1-based in ``r``) with annotation ``ann``."""
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
        ann = args[0]
    origin = typing.get_origin(ann) or ann
    if origin is int:
        return f"r[{index}]::BIGINT"
    if origin is float:
        return f"r[{index}]::DOUBLE"
    if origin is bool:
        return f"r[{index}]::BOOLEAN"
    if origin is list:
        return f"""json_transform(r[{index}], '["VARCHAR"]')"""
    return f"r[{index}]"      # str, and dicts kept as their JSON text


@functools.cache     # type hints are read once, not at every batch
def stage_sql(kind: type[Record], *, compact: bool = False) -> str:
    """The typed rows of one record kind in ``lf_raw`` (``i``: position in the batch;
    ``compact``: its :attr:`~ledgerflow.records.Record.COMPACT` fields too)."""
    types_ = field_types(kind)
    names = kind.__struct_fields__ if compact else columns(kind)
    cols = ", ".join(f'{_sql_cast(types_[name], n + 2)} AS "{name}"'
                     for n, name in enumerate(names))
    tag = kind.__struct_config__.tag
    return f"SELECT i, {cols} FROM (SELECT rowid AS i, r FROM lf_raw WHERE k = '{tag}')"


_MOVE_ON = {"seq": "seq + 1", "attempt": "then_attempt", "reason": "then_reason",
            "to_state": "then_state", "ts": "then_ts"}
#: Per staged kind, the records of a batch that stand for rows of it (format 3's outcome
#: records, :func:`ledgerflow.records.expand` in SQL): (kind, which of the rows it
#: stands for, the condition, {column: expression over its fields}; a column not named
#: is its field of that name).
_EXPANSIONS: dict[type[Record], list[tuple[type[Record], int, str, dict[str, str]]]] = {
    Transition: [
        (Transition, 0, "TRUE", {}),
        (Transition, 1, "then_state IS NOT NULL", {**_MOVE_ON, "from_state": "to_state"}),
        (TaskCreated, 0, "seq > 0", {"attempt": "0", "from_state": "NULL",
                                      "to_state": "'pending'", "reason": "''", "ts": '"at"'}),
        (TaskCreated, 1, "seq > 0 AND then_state IS NOT NULL",
         {**_MOVE_ON, "from_state": "'pending'"}),
        # format 4: the dispatch an outcome record carries (ledgerflow.records.dispatch_moves)
        (Succeeded, 0, "ready_ts IS NOT NULL",
         {"seq": "seq - 2", "attempt": "attempt - 1", "from_state": "'pending'",
          "to_state": "'ready'", "reason": "''", "ts": "ready_ts"}),
        (Succeeded, 1, "run_ts IS NOT NULL",
         {"seq": "seq - 1", "from_state": "'ready'", "to_state": "'running'",
          "reason": "'attempt ' || attempt::VARCHAR", "ts": "run_ts"}),
        (Succeeded, 2, "TRUE", {"from_state": "'running'", "to_state": "'succeeded'",
                                "reason": "''"}),
    ],
    AttemptEnded: [
        (AttemptEnded, 0, "TRUE", {}),
        (Succeeded, 0, "TRUE", {"outcome": "'ok'", "error_type": "''",
                                "error_message": "''", "traceback": "''"}),
    ],
    ResultRecorded: [
        (ResultRecorded, 0, "TRUE", {}),
        (Succeeded, 1, "TRUE", {"cached_from": "NULL"}),
    ],
}


def _tags(kind: type[Record]) -> frozenset[str]:
    """The record tags whose records stand for rows of ``kind``."""
    return frozenset(src.__struct_config__.tag for src, *_ in _EXPANSIONS[kind])  # type: ignore[misc]


#: Kinds whose records stand for rows of several staged kinds: each is cast once, into
#: ``lf_src_<tag>`` (:func:`stage_sources`), which the staging queries read.
_SOURCES: tuple[type[Record], ...] = (TaskCreated, Transition, Succeeded)


#: The dispatch moves of the batch's ``E`` records that an outcome record could have
#: carried (``[pending ->] ready -> running`` as the runner moves it): per task and
#: attempt its running move's seq and times (an attempt dispatched once in the batch).
_DISPATCHES = """
    SELECT task_key, d_attempt, min(e_i) AS e_i, any_value(d_seq) AS d_seq,
           any_value(d_run) AS d_run, any_value(d_ready) AS d_ready
    FROM (SELECT i AS e_i, task_key, seq AS d_seq, attempt AS d_attempt, ts AS d_run,
                 NULL::DOUBLE AS d_ready
          FROM lf_src_e WHERE then_state IS NULL AND from_state = 'ready'
               AND to_state = 'running' AND reason = 'attempt ' || attempt::VARCHAR
          UNION ALL
          SELECT i, task_key, seq + 1, then_attempt, then_ts, ts
          FROM lf_src_e WHERE from_state = 'pending' AND to_state = 'ready' AND reason = ''
               AND then_state = 'running' AND attempt = then_attempt - 1
               AND then_reason = 'attempt ' || then_attempt::VARCHAR)
    GROUP BY task_key, d_attempt HAVING count(*) = 1"""


def stage_sources(con: Any, kinds: set[str], run_id: str, *, carry: bool) -> None:
    """Cast the batch's records of :data:`_SOURCES` once each (those it holds); a
    creation says whether its task is ``new`` (not in ``tasks`` yet: inserted in the
    state the batch leaves it, one write a task; the others are updated). ``carry``: a
    new task's one outcome record takes the dispatch of its attempt that an ``E``
    record before it wrote (an executor outside the driver's, committed before the
    attempt started), as if it carried it (format 4): the row keeps it, and ``carried``
    names the E."""
    for kind in _SOURCES:
        tag = kind.__struct_config__.tag
        if tag == "T" and tag in kinds:
            # (no primary key on tasks: DuckDB keeps ART indexes in memory, ~2 KB a row)
            con.execute("CREATE OR REPLACE TEMP TABLE lf_src_t AS SELECT *, task_key NOT IN "
                        "(SELECT task_key FROM tasks WHERE run_id = ?) AS new FROM "
                        f"({stage_sql(kind, compact=True)})", [run_id])
        elif tag == "O" and tag in kinds:
            # (whether a new task's row keeps it: its only one, :data:`_KEPT_IN_ROW`)
            first = ("task_key IN (SELECT task_key FROM lf_src_t WHERE new) AND task_key IN "
                     "(SELECT task_key FROM s GROUP BY task_key HAVING count(*) = 1)") \
                if "T" in kinds else "FALSE"
            # (run_seq: the running move a format-4 record carries is the move before it)
            staged = (f"WITH s AS MATERIALIZED ({stage_sql(kind, compact=True)}) "
                      f"SELECT *, coalesce({first}, FALSE) AS first, "
                      "CASE WHEN run_ts IS NOT NULL THEN seq - 1 END AS run_seq FROM s")
            if carry:
                took = "f.first AND f.run_ts IS NULL AND d.e_i < f.i"
                staged = (f"WITH f AS ({staged}) SELECT f.* REPLACE ("
                          f"CASE WHEN {took} THEN d.d_run ELSE f.run_ts END AS run_ts, "
                          f"CASE WHEN {took} THEN d.d_ready ELSE f.ready_ts END AS ready_ts, "
                          f"CASE WHEN {took} THEN d.d_seq ELSE f.run_seq END AS run_seq), "
                          f"CASE WHEN {took} THEN d.e_i END AS carried FROM f LEFT JOIN "
                          f"({_DISPATCHES}) d ON d.task_key = f.task_key "
                          "AND d.d_attempt = f.attempt")
            con.execute(f"CREATE OR REPLACE TEMP TABLE lf_src_o AS {staged}")
        elif tag in kinds:
            con.execute(f"CREATE OR REPLACE TEMP TABLE lf_src_{tag.lower()} AS "
                        f"{stage_sql(kind, compact=True)}")


#: Per source tag, which of the events its records stand for a new task's row keeps
#: (:data:`.schema.EVENTS_VIEW`): a creation's two moves, and the success of the task's
#: one outcome record in the batch, with the dispatch it carries (format 4), and its
#: result (:data:`.schema.RESULTS_VIEW`).
_KEPT_IN_ROW = {
    "T": "new",
    "O": "first",
    "E": "i IN (SELECT carried FROM lf_src_o WHERE carried IS NOT NULL)",
}


@functools.cache
def _expanded_sql(kind: type[Record], tags: frozenset[str],
                  kept: frozenset[str] = frozenset()) -> str:
    """The typed rows of ``kind`` that the batch's records of ``tags`` stand for, in the
    order :func:`ledgerflow.records.expand` gives them (``i``); for events and results,
    but those a new task's row keeps (of the records of ``kept``: the row is written
    with what they say, :func:`.taskrows.task_insert`, and the views read them there)."""
    parts = []
    for src, sub, where, exprs in _EXPANSIONS[kind]:
        tag = src.__struct_config__.tag
        if tag not in tags:
            continue
        cols = ", ".join(f'{exprs.get(c) or chr(34) + c + chr(34)} AS "{c}"'
                         for c in columns(kind))
        if tag in kept:
            where = f"({where}) AND NOT ({_KEPT_IN_ROW[tag]})"
        if kind is AttemptEnded:    # the last move before it (an outcome's: its dispatch)
            cols += ", seq - 1 AS after_seq" if src is Succeeded else ", NULL AS after_seq"
        source = f"lf_src_{tag.lower()}" if src in _SOURCES else f"({stage_sql(src)})"
        parts.append(f"SELECT i * 4 + {sub} AS i, {cols} FROM {source} WHERE {where}")
    if len(parts) == 1 or kind is Transition:      # events are read by seq
        return " UNION ALL ".join(parts)
    return f"SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY i"    # rows in write order


#: The table a kind's rows are written to, where it is not the one readers read
#: (``events`` is a view: :data:`.schema.EVENTS_VIEW`).
_PHYSICAL = {"events": "event_rows", "results": "result_rows", "attempts": "attempt_rows"}


@functools.cache
def _append_sql(kind: type[Record], source: str) -> str:
    cols = ", ".join(f'"{c}"' for c in (*columns(kind), *_EXTRA.get(kind, ())))
    token = ", token" if kind.TOKENED else ""
    params = ", ?" if kind.TOKENED else ""
    table = _PHYSICAL.get(kind.TABLE or "", kind.TABLE)
    return (f"INSERT INTO {table} (run_id, {cols}{token}) "
            f"SELECT ?, {cols}{params} FROM {source}")


#: Columns a kind's staged rows have beyond its record's fields.
_EXTRA: dict[type[Record], tuple[str, ...]] = {AttemptEnded: ("after_seq",)}

#: Where an ended attempt stands among the batch's moves: the last one before it (the
#: seq grows with the place in the journal), else the run's last before the batch.
_AFTER_SEQ = """SELECT a.* REPLACE (coalesce(a.after_seq, m.seq,
                    (SELECT max_seq FROM runs WHERE run_id = $1), 0) AS after_seq)
    FROM ({rows}) a ASOF LEFT JOIN ({moves}) m ON a.i > m.i"""
#: The moves of new tasks' creations, which their rows keep (not in ``lf_e``).
_CREATION_MOVES = ("SELECT i * 4 AS i, seq FROM lf_src_t WHERE new AND seq > 0 UNION ALL "
                   "SELECT i * 4 + 1, seq + 1 FROM lf_src_t WHERE new AND seq > 0 "
                   "AND then_state IS NOT NULL")


#: Kinds staged into temporary tables (the task update reads them too).
_STAGED: dict[str, type[Record]] = {"E": Transition, "A": AttemptEnded, "R": ResultRecorded}


def insert(con: Any, run_id: str, token: int, body: bytes, scratch: Path) -> str | None:
    """Fold journal lines (``body``: complete lines) into the tables, set-based; returns
    the run state the lines leave the run in, if they move it.

    One parse, in bounded memory even for a commit of 100,000 task records,
    and no Arrow conversion (building Arrow arrays from Python lists makes
    pyarrow import pandas); the staging queries only index and cast.
    """
    # every line is a JSON array and JSON text never holds a raw newline, so
    # "]\n[" occurs only between lines: joining the arrays is one replace
    if body.startswith((b"\n", b"[]")) or body.endswith((b"\n", b"[]")) \
            or b"\n\n" in body or b"\n[]\n" in body:     # rare: empty commits or lines
        body = b"\n".join(ln for ln in body.split(b"\n") if ln not in (b"", b"[]")) or b"[]"
    private.make_dirs(scratch.parent)
    private.write_file(scratch, body.replace(b"]\n[", b","))
    del body
    try:
        # (each record's tag as a column of its own: the kinds query and the staging
        # queries filter on it, not on r[1], -6 ms at 10,000 tasks)
        con.execute("CREATE OR REPLACE TEMP TABLE lf_raw AS SELECT json[1] AS k, json AS r FROM "
                    "read_json($1, format='array', records=false, "
                    "columns={'json': 'VARCHAR[]'})", [str(scratch)])
    finally:
        scratch.unlink(missing_ok=True)
    # the kinds present, asked of DuckDB (which works without the GIL: scanning the
    # bytes here would hold up a driver thread of this process)
    # (and the run's own records, few, in one statement: each costs ~2 ms of planning)
    # (two scans, not one with a FILTER: -2 ms at 10,000 tasks)
    found, small_rows = con.execute(
        "SELECT (SELECT list(DISTINCT k) FROM lf_raw), (SELECT list(r ORDER BY rowid) "
        "FROM lf_raw WHERE k IN ('D', 'H', 'S'))").fetchone()
    kinds = set(found or ())
    small = list(small_rows or ())
    # attempts and results only in outcome records: appended from them, summarised as O
    outcomes_only = "O" in kinds and not kinds & {"A", "R"}
    # the moves new tasks' rows keep (their creation's; with O their one success's, and
    # the dispatch it carries or an E record before it wrote)
    kept = frozenset({"T", "O", "E"} if outcomes_only else {"T"}) & kinds if "T" in kinds \
        else frozenset()
    # the lf_* temp tables are replaced by the next batch and go with the connection
    stage_sources(con, kinds, run_id, carry={"T", "O", "E"} <= kept)
    staged = [k for k, kind in _STAGED.items() if kinds & _tags(kind)]
    for k in staged:
        kind = _STAGED[k]
        rows = _expanded_sql(kind, frozenset(kinds & _tags(kind)), kept)
        params = [run_id, token] if kind.TOKENED else [run_id]
        if outcomes_only and k != "E":
            con.execute(_append_sql(kind, f"({rows})"), params)
            continue
        if k == "A" and "A" in kinds:       # attempts of their own: placed among the moves
            moves = " UNION ALL ".join([*(["SELECT i, seq FROM lf_e"] if "E" in staged else []),
                                        *([_CREATION_MOVES] if "T" in kinds else [])]) \
                or "SELECT NULL::BIGINT AS i, NULL::BIGINT AS seq WHERE FALSE"
            con.execute(f"CREATE OR REPLACE TEMP TABLE lf_a AS "
                        f"{_AFTER_SEQ.format(rows=rows, moves=moves)}", [run_id])
        else:
            con.execute(f"CREATE OR REPLACE TEMP TABLE lf_{k.lower()} AS {rows}")
        con.execute(_append_sql(kind, f"lf_{k.lower()}"), params)
    summaries = ["E", "O"] if outcomes_only else staged
    # the batch that defines the run (D) writes its row as the batch leaves it; one that
    # finds the row there (its D folded before) updates it, as any later batch does
    last = last_seq(kinds) if "E" in staged else None
    created = any(r[0] == "D" for r in small) and _insert_run(con, token, small, last)
    if "T" in kinds:
        con.execute(task_insert(summaries), [run_id, token])
    # a batch that names only tasks it creates (a small run's one fold) has nothing to
    # update: the update costs ~15 ms of planning however few its rows. So has the batch
    # that created the run's row: no task of the run was folded before it
    if summaries and ("T" not in kinds or (not created and con.execute(
            f"SELECT EXISTS ({touched(summaries, skip_new=True)})").fetchone()[0])):
        moving = move_kept_results(summaries, skip_new="T" in kinds)
        if moving:
            con.execute(moving, [run_id])
        con.execute(task_update(summaries, skip_new="T" in kinds), [run_id])
    for tag, kind in KINDS.items():     # the other kinds that append rows
        if kind.TABLE and tag in kinds and tag not in _STAGED:
            con.execute(_append_sql(kind, f"({stage_sql(kind)})"),
                        [run_id, token] if kind.TOKENED else [run_id])
    if not created:
        _update_run(con, run_id, small, last)
    states = [r[1] for r in small if r[0] == "S"]
    return states[-1] if states else None


def _insert_run(con: Any, token: int, records: list[Any], last: str | None) -> bool:
    """The run's row from its definition (``D``), as the batch that defines the run
    leaves it (what :func:`_update_run` would set, in the same statement; ``last``: the
    batch's last move, if it moves tasks); False if the row was there already (then the
    caller updates it)."""
    _, rid, pipe, target, params, created, options = next(r for r in records
                                                            if r[0] == "D")[:7]
    headers = [r for r in records if r[0] == "H"]
    pid, host = (int(headers[-1][2]), headers[-1][3]) if headers else (None, None)
    moves = [r for r in records if r[0] == "S"]
    state, reason, ended = "running", None, None
    if moves:
        _, state, reason, at = moves[-1][:4]
        ended = float(at) if state in RUN_TERMINAL_VALUES else None
    # (NOT EXISTS, not ON CONFLICT: its planning costs 1.7 ms more; the fold holds the
    # file's write lock, so nobody inserts the run meanwhile)
    max_seq = f"coalesce({last}, 0)" if last else "0"
    (inserted,) = con.execute(
        "INSERT INTO runs (run_id, pipeline, target, params, options, state, reason, "
        "created_at, ended_at, token, driver_pid, driver_host, max_seq) SELECT $1, $2, $3, "
        f"$4, $5, $6, $7, $8, $9, $10, $11, $12, {max_seq} "
        "WHERE NOT EXISTS (SELECT 1 FROM runs WHERE run_id = $1)",
        [rid, pipe, target, params, options, state, reason, float(created), ended,
         max([token, *(int(h[1]) for h in headers)]), pid, host]).fetchone()
    return bool(inserted)


def _update_run(con: Any, run_id: str, records: list[Any], last: str | None) -> None:
    """One UPDATE of the run's row for the batch: its drivers' headers (the highest
    token, the last driver), its last move's seq (``last``) and its last state."""
    sets: list[str] = []
    params: list[Any] = []
    headers = [r for r in records if r[0] == "H"]
    if headers:
        _, _, pid, host = headers[-1][:4]
        sets.append("token = greatest(coalesce(token, 0), ?), driver_pid = ?, driver_host = ?")
        params += [max(int(h[1]) for h in headers), int(pid), host]
    if last:
        sets.append(f"max_seq = greatest(coalesce(max_seq, 0), {last})")
    for _, state, reason, at in [r for r in records if r[0] == "S"][-1:]:
        sets.append("state = ?, reason = ?, ended_at = ?")
        params += [state, reason, float(at) if state in RUN_TERMINAL_VALUES else None]
    if sets:
        con.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = ?", [*params, run_id])
