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
equal. A task created in the batch is inserted in the state the batch leaves it,
and its row keeps the moves of its creation (and, in a batch without failed
attempts, of its first success) that ``events`` reads (:data:`.schema.EVENTS_VIEW`)
instead of an ``event_rows`` row each.
"""

from __future__ import annotations

import functools
import re
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
from ledgerflow.states import RUN_TERMINAL, TERMINAL

_TERMINAL_SQL = "(" + ",".join(f"'{s.value}'" for s in sorted(TERMINAL)) + ")"
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


def stage_sources(con: Any, kinds: set[str], run_id: str) -> None:
    """Cast the batch's records of :data:`_SOURCES` once each (those it holds); a
    creation says whether its task is ``new`` (not in ``tasks`` yet: inserted in the
    state the batch leaves it, one write a task; the others are updated)."""
    for kind in _SOURCES:
        tag = kind.__struct_config__.tag
        if tag == "T" and tag in kinds:
            # (no primary key on tasks: DuckDB keeps ART indexes in memory, ~2 KB a row)
            con.execute("CREATE OR REPLACE TEMP TABLE lf_src_t AS SELECT *, task_key NOT IN "
                        "(SELECT task_key FROM tasks WHERE run_id = ?) AS new FROM "
                        f"({stage_sql(kind, compact=True)})", [run_id])
        elif tag in kinds:
            con.execute(f"CREATE OR REPLACE TEMP TABLE lf_src_{tag.lower()} AS "
                        f"{stage_sql(kind, compact=True)}")


#: Per source tag, which of the events its records stand for a new task's row keeps
#: (:data:`.schema.EVENTS_VIEW`): a creation's two moves, and the success of the task's
#: first outcome record in the batch.
_KEPT_IN_ROW = {
    "T": "new",
    "O": "i IN (SELECT min(i) FROM lf_src_o WHERE task_key IN "
         "(SELECT task_key FROM lf_src_t WHERE new) GROUP BY task_key)",
}


@functools.cache
def _expanded_sql(kind: type[Record], tags: frozenset[str],
                  kept: frozenset[str] = frozenset()) -> str:
    """The typed rows of ``kind`` that the batch's records of ``tags`` stand for, in the
    order :func:`ledgerflow.records.expand` gives them (``i``). Events also say whether
    a task row keeps them (``in_row``), for the records of ``kept``."""
    parts = []
    for src, sub, where, exprs in _EXPANSIONS[kind]:
        tag = src.__struct_config__.tag
        if tag not in tags:
            continue
        cols = ", ".join(f'{exprs.get(c) or chr(34) + c + chr(34)} AS "{c}"'
                         for c in columns(kind))
        if kind is Transition:
            cols += f", {_KEPT_IN_ROW[tag] if tag in kept else 'FALSE'} AS in_row"
        source = f"lf_src_{tag.lower()}" if src in _SOURCES else f"({stage_sql(src)})"
        parts.append(f"SELECT i * 4 + {sub} AS i, {cols} FROM {source} WHERE {where}")
    if len(parts) == 1 or kind is Transition:      # events are read by seq
        return " UNION ALL ".join(parts)
    return f"SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY i"    # rows in write order


#: The table a kind's rows are written to, where it is not the one readers read
#: (``events`` is a view: :data:`.schema.EVENTS_VIEW`).
_PHYSICAL = {"events": "event_rows"}


@functools.cache
def _append_sql(kind: type[Record], source: str) -> str:
    cols = ", ".join(f'"{c}"' for c in columns(kind))
    token = ", token" if kind.TOKENED else ""
    params = ", ?" if kind.TOKENED else ""
    table = _PHYSICAL.get(kind.TABLE or "", kind.TABLE)
    where = " WHERE NOT in_row" if kind is Transition else ""
    return (f"INSERT INTO {table} (run_id, {cols}{token}) "
            f"SELECT ?, {cols}{params} FROM {source}{where}")


#: Kinds staged into temporary tables (the task update reads them too).
_STAGED: dict[str, type[Record]] = {"E": Transition, "A": AttemptEnded, "R": ResultRecorded}


def _result_sets(alias: str) -> dict[str, str]:
    """The ``tasks`` result columns, from the summary ``alias`` of a task's results."""
    return {col: f"CASE WHEN {alias}.task_key IS NULL THEN tasks.{col} ELSE {alias}.{src} END"
            for col, src in (("fingerprint", "fingerprint"), ("result_hash", "content_hash"),
                             ("result_kind", "kind"), ("result_data", "data"),
                             ("result_uri", "uri"), ("result_size", "size"),
                             ("cached_from", "cached_from"), ("result_attempt", "attempt"))}


#: Per staged kind: the per-task summary of a batch, and the ``tasks`` columns it sets.
_SUMMARIES: dict[str, tuple[str, dict[str, str]]] = {
    # a resume reset (to pending from a state) times the task afresh: its start is the
    # first running after the last reset
    "E": ("""SELECT task_key, arg_max(to_state, seq) AS state, max(attempt) AS attempts,
                    min(ts) FILTER (WHERE to_state = 'running' AND seq > coalesce(reset_seq, -1))
                        AS started_at,
                    arg_max(ts, seq) AS last_at,
                    arg_max(attempt, seq) FILTER (WHERE to_state = 'pending'
                                                  AND from_state IS NOT NULL) AS budget_base,
                    list({'i': i, 'reason': reason} ORDER BY i) FILTER (WHERE to_state IN
                         ('failed', 'upstream_failed') AND reason <> '') AS fails
              FROM (SELECT *, max(seq) FILTER (WHERE to_state = 'pending'
                                               AND from_state IS NOT NULL)
                              OVER (PARTITION BY task_key) AS reset_seq FROM lf_e)
              GROUP BY task_key""",
          {"state": "coalesce(e.state, tasks.state)",
           "started_at": "CASE WHEN e.budget_base IS NOT NULL THEN e.started_at "
                         "ELSE coalesce(tasks.started_at, e.started_at) END",
           "ended_at": f"CASE WHEN e.state IN {_TERMINAL_SQL} THEN e.last_at "
                       "WHEN e.budget_base IS NOT NULL THEN NULL ELSE tasks.ended_at END",
           "budget_base": "coalesce(e.budget_base, tasks.budget_base)"}),
    # the error text: ledgerflow.views.error_text in SQL
    "A": ("""SELECT task_key, max(attempt) AS attempts, max(i) AS last_i,
                    arg_max_null(CASE WHEN outcome IN ('ok', 'waiting') THEN NULL
                         WHEN outcome IN ('timeout', 'lost', 'cancelled') THEN
                             CASE WHEN coalesce(error_message, '') = '' THEN outcome
                                  ELSE outcome || ': ' || error_message END
                         WHEN coalesce(error_type, '') = '' THEN error_message
                         ELSE error_type || ': ' || error_message END, i) AS error
             FROM lf_a GROUP BY task_key""",
          {}),
    # (the error column is set from A and E together: see _ERROR)
    "R": ("""SELECT task_key, arg_max_null(fingerprint, i) AS fingerprint,
                    arg_max_null(content_hash, i) AS content_hash,
                    arg_max_null(kind, i) AS kind, arg_max_null(data, i) AS data,
                    arg_max_null(uri, i) AS uri, arg_max_null(size, i) AS size,
                    arg_max_null(cached_from, i) AS cached_from,
                    arg_max_null(attempt, i) AS attempt
             FROM lf_r GROUP BY task_key""",
          _result_sets("r")),
}
#: A batch whose attempts and results all stand in outcome records (``O``: format 3's
#: usual batch) summarises them from ``lf_src_o`` at once: the ``A`` and ``R`` summaries
#: of the rows they stand for (an ok attempt: no error; a result: not cached), in one
#: subquery and one join (the task rows' statement plans in ~3 ms less).
_SUMMARIES["O"] = (
    """SELECT task_key, max(attempt) AS attempts, max(i) * 4 AS last_i,
              arg_max_null(fingerprint, i) AS fingerprint,
              arg_max_null(content_hash, i) AS content_hash, arg_max_null(kind, i) AS kind,
              arg_max_null(data, i) AS data, arg_max_null(uri, i) AS uri,
              arg_max_null(size, i) AS size, NULL::VARCHAR AS cached_from,
              arg_max_null(attempt, i) AS attempt, arg_min(seq, i) AS ok_seq,
              arg_min(attempt, i) AS ok_attempt, arg_min(ts, i) AS ok_ts
       FROM lf_src_o GROUP BY task_key""",
    _result_sets("o"))
#: The table each summary reads (the task keys a batch touches).
_SOURCE_OF = {"E": "lf_e", "A": "lf_a", "R": "lf_r", "O": "lf_src_o"}

#: The ``error`` column, by which of A and E a batch holds, as the projection applies
#: records in order: the last attempt's error; else why the task failed without one (a
#: refused approval, an upstream that failed), from the first such move after that
#: attempt (an earlier one is overwritten by the attempt, even by an ok one).
_ERROR: dict[tuple[bool, bool], str] = {
    (True, False): "CASE WHEN a.task_key IS NULL THEN tasks.error ELSE a.error END",
    (False, True): "coalesce(tasks.error, e.fails[1].reason)",
    (True, True): "coalesce(CASE WHEN a.task_key IS NULL THEN tasks.error ELSE a.error END, "
                  "list_filter(e.fails, lambda f: f.i > coalesce(a.last_i, -1))[1].reason)",
}
#: The same with the attempts in outcome records (``O``, which stand for E rows too):
#: an ok attempt has no error.
_ERROR_O = ("coalesce(CASE WHEN o.task_key IS NULL THEN tasks.error END, "
            "list_filter(e.fails, lambda f: f.i > coalesce(o.last_i, -1))[1].reason)")


def _touched(kinds: list[str], *, skip_new: bool) -> str:
    """The task keys the batch's events, attempts and results name (``skip_new``: but
    not the tasks it creates)."""
    keys = " UNION ".join(f"SELECT task_key FROM {_SOURCE_OF[k]}" for k in kinds)
    if skip_new:
        keys = f"SELECT task_key FROM ({keys}) EXCEPT SELECT task_key FROM lf_src_t WHERE new"
    return keys


def _task_update(kinds: list[str], *, skip_new: bool = False) -> str:
    """One UPDATE of ``tasks`` from the batch's events, attempts and results.

    ``skip_new``: leave out the new tasks of ``lf_src_t`` (created in this batch, inserted
    with their state already by :func:`_task_insert`).
    """
    keys = _touched(kinds, skip_new=skip_new)
    joins = " ".join(f"LEFT JOIN ({_SUMMARIES[k][0]}) {k.lower()} "
                     f"ON {k.lower()}.task_key = k.task_key" for k in kinds)
    sets = ", ".join(f"{col} = {expr}" for col, expr in _task_sets(kinds).items())
    return (f"UPDATE tasks SET {sets} FROM ({keys}) k {joins} "
            f"WHERE tasks.run_id = ? AND tasks.task_key = k.task_key")


def _task_sets(kinds: list[str]) -> dict[str, str]:
    """The columns the task update sets for a batch holding ``kinds`` (of E, A, R, O), and
    their expressions (over ``tasks.*`` and the batch's summaries)."""
    sets: dict[str, str] = {}
    for k in kinds:
        sets.update(_SUMMARIES[k][1])
    if "O" in kinds:
        sets["error"] = _ERROR_O
    elif "A" in kinds or "E" in kinds:
        sets["error"] = _ERROR[("A" in kinds, "E" in kinds)]
    counts = ", ".join(f"coalesce({k.lower()}.attempts, 0)" for k in kinds if k != "R")
    if counts:
        sets["attempts"] = f"greatest(tasks.attempts, {counts})"
    return sets


#: What a task row holds when it is created (``tasks.X`` in :func:`_task_sets` for a
#: task created in the same batch).
_NEW_TASK = {"state": "'pending'", "attempts": "0", "budget_base": "0"}
_TASK_STATE_COLUMNS = ("state", "attempts", "budget_base", "started_at", "ended_at", "error",
                       "fingerprint", "result_hash", "result_kind", "result_data",
                       "result_uri", "result_size", "cached_from", "result_attempt")
#: The moves a new task's row keeps (:data:`_KEPT_IN_ROW`; ``$2``: the batch's token):
#: its creation's, and with the outcome records summarised (``O``) its first success's.
_CREATED = {"created_seq": "CASE WHEN t.seq > 0 THEN t.seq END",
            "created_ts": 'CASE WHEN t.seq > 0 THEN t."at" END',
            "created_token": "CASE WHEN t.seq > 0 THEN $2 END",
            **{f"then_{f}": f"CASE WHEN t.seq > 0 THEN t.then_{f} END"
               for f in ("state", "attempt", "reason", "ts")}}
_SUCCEEDED = {"ok_seq": "o.ok_seq", "ok_attempt": "o.ok_attempt", "ok_ts": "o.ok_ts",
              "ok_token": "CASE WHEN o.ok_seq IS NOT NULL THEN $2 END"}


def _task_insert(kinds: list[str]) -> str:
    """One INSERT of the tasks created in this batch (``new``), with the state the
    batch's events, attempts and results leave them in: the same expressions as
    :func:`_task_update`, applied to a row as created (one write a task, not two)."""
    joins = " ".join(f"LEFT JOIN ({_SUMMARIES[k][0]}) {k.lower()} "
                     f"ON {k.lower()}.task_key = t.task_key" for k in kinds)
    exprs = {col: re.sub(r"\btasks\.(\w+)", lambda m: _NEW_TASK.get(m.group(1), "NULL"), expr)
             for col, expr in _task_sets(kinds).items()}
    values = [exprs.get(c, _NEW_TASK.get(c, "NULL")) for c in _TASK_STATE_COLUMNS]
    kept = {**_CREATED, **(_SUCCEEDED if "O" in kinds else {})}
    return ("INSERT INTO tasks (run_id, task_key, task_name, node, item_key, position, "
            f"upstream, code_version, {', '.join([*_TASK_STATE_COLUMNS, *kept])}) "
            "SELECT $1, t.task_key, t.task_name, t.node, t.item_key, t.position, t.upstream, "
            f"t.code_version, {', '.join([*values, *kept.values()])} "
            f"FROM (SELECT * FROM lf_src_t WHERE new) t {joins} ORDER BY t.i")


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
    # the lf_* temp tables are replaced by the next batch and go with the connection
    stage_sources(con, kinds, run_id)
    staged = [k for k, kind in _STAGED.items() if kinds & _tags(kind)]
    # attempts and results only in outcome records: appended from them, summarised as O
    outcomes_only = "O" in kinds and not kinds & {"A", "R"}
    # the moves new tasks' rows keep (their creation's; their first success's with O)
    kept = frozenset({"T", "O"} if outcomes_only else {"T"}) & kinds if "T" in kinds \
        else frozenset()
    for k in staged:
        kind = _STAGED[k]
        rows = _expanded_sql(kind, frozenset(kinds & _tags(kind)),
                             kept if kind is Transition else frozenset())
        params = [run_id, token] if kind.TOKENED else [run_id]
        if outcomes_only and k != "E":
            con.execute(_append_sql(kind, f"({rows})"), params)
            continue
        con.execute(f"CREATE OR REPLACE TEMP TABLE lf_{k.lower()} AS {rows}")
        con.execute(_append_sql(kind, f"lf_{k.lower()}"), params)
    summaries = ["E", "O"] if outcomes_only else staged
    # the batch that defines the run (D) writes its row as the batch leaves it; one that
    # finds the row there (its D folded before) updates it, as any later batch does
    created = any(r[0] == "D" for r in small) and _insert_run(con, token, small,
                                                              moved="E" in staged)
    if "T" in kinds:
        con.execute(_task_insert(summaries), [run_id, token])
    # a batch that names only tasks it creates (a small run's one fold) has nothing to
    # update: the update costs ~15 ms of planning however few its rows. So has the batch
    # that created the run's row: no task of the run was folded before it
    if summaries and ("T" not in kinds or (not created and con.execute(
            f"SELECT EXISTS ({_touched(summaries, skip_new=True)})").fetchone()[0])):
        con.execute(_task_update(summaries, skip_new="T" in kinds), [run_id])
    for tag, kind in KINDS.items():     # the other kinds that append rows
        if kind.TABLE and tag in kinds and tag not in _STAGED:
            con.execute(_append_sql(kind, f"({stage_sql(kind)})"),
                        [run_id, token] if kind.TOKENED else [run_id])
    if not created:
        _update_run(con, run_id, small, moved="E" in staged)
    states = [r[1] for r in small if r[0] == "S"]
    return states[-1] if states else None


def _insert_run(con: Any, token: int, records: list[Any], *, moved: bool) -> bool:
    """The run's row from its definition (``D``), as the batch that defines the run
    leaves it (what :func:`_update_run` would set, in the same statement); False if the
    row was there already (then the caller updates it)."""
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
    max_seq = "(SELECT coalesce(max(seq), 0) FROM lf_e)" if moved else "0"
    (inserted,) = con.execute(
        "INSERT INTO runs (run_id, pipeline, target, params, options, state, reason, "
        "created_at, ended_at, token, driver_pid, driver_host, max_seq) SELECT $1, $2, $3, "
        f"$4, $5, $6, $7, $8, $9, $10, $11, $12, {max_seq} "
        "WHERE NOT EXISTS (SELECT 1 FROM runs WHERE run_id = $1)",
        [rid, pipe, target, params, options, state, reason, float(created), ended,
         max([token, *(int(h[1]) for h in headers)]), pid, host]).fetchone()
    return bool(inserted)


def _update_run(con: Any, run_id: str, records: list[Any], *, moved: bool) -> None:
    """One UPDATE of the run's row for the batch: its drivers' headers (the highest
    token, the last driver), its last move's seq (``moved``) and its last state."""
    sets: list[str] = []
    params: list[Any] = []
    headers = [r for r in records if r[0] == "H"]
    if headers:
        _, _, pid, host = headers[-1][:4]
        sets.append("token = greatest(coalesce(token, 0), ?), driver_pid = ?, driver_host = ?")
        params += [max(int(h[1]) for h in headers), int(pid), host]
    if moved:
        sets.append("max_seq = greatest(coalesce(max_seq, 0), (SELECT max(seq) FROM lf_e))")
    for _, state, reason, at in [r for r in records if r[0] == "S"][-1:]:
        sets.append("state = ?, reason = ?, ended_at = ?")
        params += [state, reason, float(at) if state in RUN_TERMINAL_VALUES else None]
    if sets:
        con.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = ?", [*params, run_id])
