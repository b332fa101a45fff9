"""The SQL that brings a run's ``tasks`` rows to the state one batch of journal lines leaves them in.

Each batch's staged records (``lf_e``, ``lf_a``, ``lf_r``, ``lf_src_o``: see
:mod:`.batch`) are summarised per task, and one ``UPDATE`` applies the
summaries to the rows already there (:func:`task_update`) and one ``INSERT``
writes the tasks the batch creates in the state it leaves them
(:func:`task_insert`): :func:`ledgerflow.projection.apply` in SQL.
"""

from __future__ import annotations

import re

from ledgerflow.states import TERMINAL

_TERMINAL_SQL = "(" + ",".join(f"'{s.value}'" for s in sorted(TERMINAL)) + ")"


def _result_sets(alias: str) -> dict[str, str]:
    """The ``tasks`` result columns, from the summary ``alias`` of a task's results (a
    row's kept result, ``ok_result``, was moved out first: :func:`move_kept_results`)."""
    sets = {col: f"CASE WHEN {alias}.task_key IS NULL THEN tasks.{col} ELSE {alias}.{src} END"
            for col, src in (("fingerprint", "fingerprint"), ("result_hash", "content_hash"),
                             ("result_kind", "kind"), ("result_data", "data"),
                             ("result_uri", "uri"), ("result_size", "size"),
                             ("cached_from", "cached_from"), ("result_attempt", "attempt"))}
    # (the kept attempt stays: FALSE)
    sets["ok_result"] = (f"CASE WHEN {alias}.task_key IS NOT NULL AND tasks.ok_result "
                         "THEN FALSE ELSE tasks.ok_result END")
    return sets


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
    # a task's only outcome record in the batch is its own summary (``first``: a new
    # task's, which its row keeps); the others are aggregated
    """SELECT task_key, attempt AS attempts, i * 4 AS last_i, fingerprint, content_hash,
              kind, data, uri, size, NULL::VARCHAR AS cached_from, attempt, seq AS ok_seq,
              attempt AS ok_attempt, ts AS ok_ts, run_seq AS ok_run_seq,
              run_ts AS ok_run_ts, ready_ts AS ok_ready_ts, started_at AS ok_started,
              ended_at AS ok_ended
       FROM lf_src_o WHERE first
       UNION ALL
       SELECT task_key, max(attempt), max(i) * 4, arg_max_null(fingerprint, i),
              arg_max_null(content_hash, i), arg_max_null(kind, i), arg_max_null(data, i),
              arg_max_null(uri, i), arg_max_null(size, i), NULL, arg_max_null(attempt, i),
              NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
       FROM lf_src_o WHERE NOT first GROUP BY task_key""",
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


def touched(kinds: list[str], *, skip_new: bool) -> str:
    """The task keys the batch's events, attempts and results name (``skip_new``: but
    not the tasks it creates)."""
    keys = " UNION ".join(f"SELECT task_key FROM {_SOURCE_OF[k]}" for k in kinds)
    if skip_new:
        keys = f"SELECT task_key FROM ({keys}) EXCEPT SELECT task_key FROM lf_src_t WHERE new"
    return keys


def move_kept_results(kinds: list[str], *, skip_new: bool) -> str | None:
    """The INSERT that writes out, as ``result_rows``, the results task rows keep
    (``ok_result``) of the tasks whose results the batch changes (None: it changes
    none), before :func:`task_update` overwrites them (``skip_new``: as there)."""
    changing = [k for k in kinds if k in ("R", "O")]
    if not changing:
        return None
    return ("INSERT INTO result_rows (run_id, task_key, attempt, fingerprint, content_hash, "
            "kind, data, uri, size, cached_from) SELECT run_id, task_key, ok_attempt, "
            "fingerprint, result_hash, result_kind, result_data, result_uri, result_size, "
            "NULL FROM tasks WHERE run_id = ? AND ok_result AND task_key IN "
            f"({touched(changing, skip_new=skip_new)})")


def task_update(kinds: list[str], *, skip_new: bool = False) -> str:
    """One UPDATE of ``tasks`` from the batch's events, attempts and results.

    ``skip_new``: leave out the new tasks of ``lf_src_t`` (created in this batch, inserted
    with their state already by :func:`task_insert`).
    """
    keys = touched(kinds, skip_new=skip_new)
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
              "ok_token": "CASE WHEN o.ok_seq IS NOT NULL THEN $2 END",
              "ok_run_seq": "o.ok_run_seq", "ok_run_ts": "o.ok_run_ts",
              "ok_ready_ts": "o.ok_ready_ts", "ok_started": "o.ok_started",
              "ok_ended": "o.ok_ended",
              "ok_result": "CASE WHEN o.ok_seq IS NOT NULL THEN TRUE END"}


#: What a new task's creation record says of its moves (kept in its row, not in ``lf_e``:
#: :func:`_expanded_sql`): the state, time and attempt of its last one, a ``running``
#: one's time, and why it failed there (``upstream_failed`` as it was created).
_NEW_T = ("CASE WHEN seq > 0 THEN coalesce(then_state, 'pending') END AS mv_state, "
          'CASE WHEN seq > 0 THEN CASE WHEN then_state IS NULL THEN "at" ELSE then_ts END '
          "END AS mv_ts, "
          "CASE WHEN seq > 0 AND then_state IS NOT NULL THEN then_attempt ELSE 0 END "
          "AS mv_attempt, "
          "CASE WHEN seq > 0 AND then_state = 'running' THEN then_ts END AS mv_run, "
          "CASE WHEN seq > 0 AND then_state IN ('failed', 'upstream_failed') "
          "AND then_reason <> '' THEN then_reason END AS mv_fail")


def _new_task_values(kinds: list[str]) -> dict[str, str]:
    """The state columns of a task created in the batch: :func:`_task_sets` applied to a
    row as created, with the moves its row keeps (its creation's, and with ``O`` its
    first success's and the dispatch that carries: the task's last move) folded in."""
    exprs = {col: re.sub(r"\btasks\.(\w+)", lambda m: _NEW_TASK.get(m.group(1), "NULL"), expr)
             for col, expr in _task_sets(kinds).items()}
    state_ok = ended_ok = run = ""
    if "O" in kinds:        # its first success, kept in its row, is its last move
        state_ok = "WHEN o.ok_seq IS NOT NULL THEN 'succeeded' "
        ended_ok, run = "WHEN o.ok_seq IS NOT NULL THEN o.ok_ts ", ", o.ok_run_ts"
    exprs["state"] = f"CASE {state_ok}WHEN TRUE THEN coalesce(e.state, t.mv_state, 'pending') END"
    exprs["started_at"] = f"least(e.started_at, t.mv_run{run})"
    exprs["ended_at"] = (f"CASE {ended_ok}WHEN e.task_key IS NOT NULL THEN "
                         f"CASE WHEN e.state IN {_TERMINAL_SQL} THEN e.last_at END "
                         f"WHEN t.mv_state IN {_TERMINAL_SQL} THEN t.mv_ts END")
    exprs["attempts"] = f"greatest({exprs.get('attempts', '0')}, t.mv_attempt)"
    exprs["error"] = f"coalesce({exprs.get('error', 'NULL')}, t.mv_fail)"
    return exprs


def task_insert(kinds: list[str]) -> str:
    """One INSERT of the tasks created in this batch (``new``), with the state the
    batch's events, attempts and results leave them in: the same expressions as
    :func:`task_update`, applied to a row as created (one write a task, not two)."""
    joins = " ".join(f"LEFT JOIN ({_SUMMARIES[k][0]}) {k.lower()} "
                     f"ON {k.lower()}.task_key = t.task_key" for k in kinds)
    exprs = _new_task_values(kinds)
    values = [exprs.get(c, _NEW_TASK.get(c, "NULL")) for c in _TASK_STATE_COLUMNS]
    kept = {**_CREATED, **(_SUCCEEDED if "O" in kinds else {})}
    return ("INSERT INTO tasks (run_id, task_key, task_name, node, item_key, position, "
            f"upstream, code_version, {', '.join([*_TASK_STATE_COLUMNS, *kept])}) "
            "SELECT $1, t.task_key, t.task_name, t.node, t.item_key, t.position, t.upstream, "
            f"t.code_version, {', '.join([*values, *kept.values()])} "
            f"FROM (SELECT *, {_NEW_T} FROM lf_src_t WHERE new) t {joins} ORDER BY t.i")


def last_seq(kinds: set[str]) -> str:
    """The batch's last move: of ``lf_e``, and of the moves new task rows keep."""
    parts = ["(SELECT max(seq) FROM lf_e)"]
    if "T" in kinds:
        parts.append("(SELECT max(seq + (then_state IS NOT NULL)::INTEGER) FROM lf_src_t "
                     "WHERE seq > 0)")
    if "O" in kinds:
        parts.append("(SELECT max(seq) FROM lf_src_o)")
    return f"greatest({', '.join(parts)})"
