"""The ledger's tables: DDL, ordered migrations, and the schema check.

The migrations a file lacks run in one transaction with the version they
reach (a new ledger: ~11 ms, one commit instead of one a migration), so a
crash mid-migration leaves the previous version (DuckDB rolls the rest
back) and the next writer completes it. A file with no tables at all is a
ledger at version 0 (e.g. killed while it was being created).
"""

from __future__ import annotations

from typing import Any

from ledgerflow.errors import NotALedgerError, SchemaVersionError

from .engine import duckdb

SCHEMA_VERSION = 6
#: The fix for a file that is not a ledger (every command and ``pipeline doctor`` say it).
NOT_A_LEDGER = ("pass --store the path of a ledgerflow ledger (a new path creates one); "
                "this file is someone else's")

#: The ``tasks`` columns the moves of a task's creation and success are derived from
#: (schema version 5; see :data:`EVENTS_VIEW`).
V5_COLUMNS = ("created_seq BIGINT", "created_ts DOUBLE", "created_token INTEGER",
              "then_state VARCHAR", "then_attempt INTEGER", "then_reason VARCHAR",
              "then_ts DOUBLE", "ok_seq BIGINT", "ok_attempt INTEGER", "ok_ts DOUBLE",
              "ok_token INTEGER")
#: And those of the dispatch of that success's attempt (``ready -> running`` as move
#: ``ok_run_seq``, and ``pending -> ready`` right before it), which a format-4
#: ``Succeeded`` carries or a record before it wrote, of that attempt (its
#: ``attempts`` row), and whether the row's result is also its ``results`` row
#: (``ok_result``: TRUE; FALSE once a later result moved it out, the attempt still
#: kept; schema version 6, see :data:`RESULTS_VIEW` and :data:`ATTEMPTS_VIEW`).
V6_COLUMNS = ("ok_run_seq BIGINT", "ok_run_ts DOUBLE", "ok_ready_ts DOUBLE",
              "ok_started DOUBLE", "ok_ended DOUBLE", "ok_result BOOLEAN")
#: Every column of ``tasks`` that holds what ``events``, ``attempts`` and ``results``
#: read.
DERIVED_COLUMNS = (*V5_COLUMNS, *V6_COLUMNS)
#: Every result recorded: the rows of ``result_rows``, and the result a task's row holds
#: when the fold wrote the task with its one success (``ok_result``: a plain task's
#: result is one table row, not two; a later result of the task moves it out first).
RESULTS_VIEW = """
    SELECT run_id, task_key, attempt, fingerprint, content_hash, kind, data, uri, size,
           cached_from
    FROM result_rows
    UNION ALL
    SELECT run_id, task_key, ok_attempt, fingerprint, result_hash, result_kind, result_data,
           result_uri, result_size, NULL
    FROM tasks WHERE ok_result"""
def _attempts(extra: tuple[str, str] = ("token", "ok_token")) -> str:
    """The rows of ``attempt_rows`` and the ok attempts task rows keep, with one more
    column of each (``extra``: its expression for a row, for a kept attempt)."""
    row, kept = extra
    return f"""
    SELECT run_id, task_key, attempt, outcome, started_at, ended_at, error_type,
           error_message, traceback, {row}
    FROM attempt_rows
    UNION ALL
    SELECT run_id, task_key, ok_attempt, 'ok', ok_started, ok_ended, '', '', '', {kept}
    FROM tasks WHERE ok_result IS NOT NULL"""


#: Every attempt that ended: the rows of ``attempt_rows``, and the ok attempt a task's
#: row holds when the fold wrote the task with its one success.
ATTEMPTS_VIEW = _attempts()
#: The attempts of ``ATTEMPTS_VIEW`` in the order written (``_after``: the last move
#: before the attempt ended; the kept one ends right before its success, after any
#: attempt row with the same move before it).
_IN_ORDER = ("after_seq AS _after, 0 AS _kept, rowid AS _row", "ok_seq - 1, 1, 0")
ATTEMPTS_IN_ORDER = f"({_attempts(_IN_ORDER)}) AS attempts_in_order"
_EVENTS_V5 = """
    SELECT run_id, seq, task_key, attempt, from_state, to_state, reason, ts, token
    FROM event_rows
    UNION ALL
    SELECT run_id, created_seq, task_key, 0, NULL, 'pending', '', created_ts, created_token
    FROM tasks WHERE created_seq IS NOT NULL
    UNION ALL
    SELECT run_id, created_seq + 1, task_key, then_attempt, 'pending', then_state,
           then_reason, then_ts, created_token
    FROM tasks WHERE created_seq IS NOT NULL AND then_state IS NOT NULL
    UNION ALL
    SELECT run_id, ok_seq, task_key, ok_attempt, 'running', 'succeeded', '', ok_ts, ok_token
    FROM tasks WHERE ok_seq IS NOT NULL"""
#: Every move of every task: the rows of ``event_rows``, and the moves task rows hold
#: (:func:`ledgerflow.records.expand` of the ``TaskCreated`` and ``Succeeded`` the fold
#: kept in the row, the dispatch a ``Succeeded`` carries included).
EVENTS_VIEW = _EVENTS_V5 + """
    UNION ALL
    SELECT run_id, ok_run_seq - 1, task_key, ok_attempt - 1, 'pending', 'ready', '',
           ok_ready_ts, ok_token
    FROM tasks WHERE ok_ready_ts IS NOT NULL
    UNION ALL
    SELECT run_id, ok_run_seq, task_key, ok_attempt, 'ready', 'running',
           'attempt ' || ok_attempt::VARCHAR, ok_run_ts, ok_token
    FROM tasks WHERE ok_run_ts IS NOT NULL"""

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE TABLE IF NOT EXISTS meta(key VARCHAR PRIMARY KEY, value VARCHAR)",
        """CREATE TABLE runs(run_id VARCHAR PRIMARY KEY, pipeline VARCHAR, target VARCHAR,
            params VARCHAR, options VARCHAR, state VARCHAR, reason VARCHAR,
            created_at DOUBLE, ended_at DOUBLE, token INTEGER, driver_pid INTEGER,
            driver_host VARCHAR, max_seq BIGINT)""",
        """CREATE TABLE tasks(run_id VARCHAR, task_key VARCHAR, task_name VARCHAR,
            node VARCHAR, item_key VARCHAR, position INTEGER, upstream VARCHAR[],
            code_version VARCHAR, state VARCHAR, attempts INTEGER, budget_base INTEGER,
            started_at DOUBLE, ended_at DOUBLE, error VARCHAR, fingerprint VARCHAR,
            result_hash VARCHAR, result_kind VARCHAR, result_data VARCHAR,
            result_uri VARCHAR, result_size BIGINT, cached_from VARCHAR,
            result_attempt INTEGER)""",
        """CREATE TABLE events(run_id VARCHAR, seq BIGINT, task_key VARCHAR,
            attempt INTEGER, from_state VARCHAR, to_state VARCHAR, reason VARCHAR,
            ts DOUBLE, token INTEGER)""",
        """CREATE TABLE attempts(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            outcome VARCHAR, started_at DOUBLE, ended_at DOUBLE, error_type VARCHAR,
            error_message VARCHAR, traceback VARCHAR, token INTEGER)""",
        """CREATE TABLE results(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            fingerprint VARCHAR, content_hash VARCHAR, kind VARCHAR, data VARCHAR,
            uri VARCHAR, size BIGINT, cached_from VARCHAR)""",
        """CREATE TABLE artifacts(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            direction VARCHAR, uri VARCHAR, content_hash VARCHAR, attrs VARCHAR)""",
        """CREATE TABLE notices(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            kind VARCHAR, message VARCHAR, ts DOUBLE)""",
        """CREATE TABLE journal_folds(run_id VARCHAR, token INTEGER, "offset" BIGINT,
            PRIMARY KEY(run_id, token))""",
        """CREATE VIEW lineage AS
            SELECT t.run_id, t.task_key, t.result_attempt AS attempt, 'input' AS direction,
                   'task:' || ut.task_key AS uri, ut.result_hash AS content_hash,
                   t.code_version, NULL::VARCHAR AS attrs
            FROM tasks t, unnest(t.upstream) AS u(up)
            JOIN tasks ut ON ut.run_id = t.run_id AND (ut.task_key = u.up
                 OR (ut.node = u.up AND ut.position IS NOT NULL))
            UNION ALL
            SELECT run_id, task_key, result_attempt, 'output', 'task:' || task_key,
                   result_hash, code_version, NULL FROM tasks WHERE state = 'succeeded'
            UNION ALL
            SELECT a.run_id, a.task_key, a.attempt, a.direction, a.uri, a.content_hash,
                   t.code_version, a.attrs
            FROM artifacts a LEFT JOIN tasks t USING (run_id, task_key)""",
    ]),
    (2, [
        # where a journal segment stops being readable (its records after it are dropped)
        """CREATE TABLE journal_damage(run_id VARCHAR, token INTEGER, "offset" BIGINT,
            reason VARCHAR, ts DOUBLE)""",
        # per-attempt output of tasks (stdout, stderr, logging), capped
        """CREATE TABLE logs(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            stream VARCHAR, text VARCHAR, dropped BIGINT, token INTEGER)""",
    ]),
    (3, [
        # approval gates: requests, decisions, and the current state of each request
        """CREATE TABLE approval_requests(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            digest VARCHAR, action VARCHAR, summary VARCHAR, inputs VARCHAR,
            requested_at DOUBLE, deadline DOUBLE, on_timeout VARCHAR, approvers VARCHAR[],
            note VARCHAR)""",
        """CREATE TABLE approval_decisions(run_id VARCHAR, task_key VARCHAR, digest VARCHAR,
            decision VARCHAR, decided_by VARCHAR, reason VARCHAR, decided_at DOUBLE)""",
        """CREATE VIEW approvals AS
            SELECT r.run_id, r.task_key, r.attempt, r.digest, r.action, r.summary, r.inputs,
                   r.requested_at, r.deadline, r.on_timeout, r.approvers, r.note,
                   coalesce(d.decision, 'pending') AS state, d.decided_by, d.reason,
                   d.decided_at
            FROM approval_requests r LEFT JOIN (
                SELECT DISTINCT ON (run_id, task_key, digest) * FROM approval_decisions
                ORDER BY run_id, task_key, digest, decided_at) d
            USING (run_id, task_key, digest)""",
        # results of steps tasks recorded (context().step), replayed on re-runs
        """CREATE TABLE steps(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            name VARCHAR, kind VARCHAR, data VARCHAR, content_hash VARCHAR)""",
    ]),
    (4, [
        # every model call and tool call of agent and model tasks
        """CREATE TABLE model_calls(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            seq INTEGER, provider VARCHAR, model VARCHAR, key_alias VARCHAR,
            request_hash VARCHAR, response_hash VARCHAR, input_tokens BIGINT,
            output_tokens BIGINT, cost DOUBLE, latency DOUBLE, finish_reason VARCHAR,
            tool_calls VARCHAR[], reserved_tokens BIGINT, reserved_cost DOUBLE,
            replayed BOOLEAN, content VARCHAR)""",
        """CREATE TABLE tool_calls(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            seq INTEGER, tool VARCHAR, arguments_digest VARCHAR, approved_by VARCHAR,
            outcome VARCHAR, result_hash VARCHAR, error VARCHAR, replayed BOOLEAN)""",
    ]),
    (5, [
        # a task row holds the moves of its creation (format 3's TaskCreated: pending and
        # the move after it) and of its success (Succeeded: running -> succeeded) when
        # they were folded with it: ``events`` is a view of the moves written as rows
        # and those (one task row, not four event rows, for a plain task)
        "ALTER TABLE events RENAME TO event_rows",
        *(f"ALTER TABLE tasks ADD COLUMN {col}" for col in V5_COLUMNS),
        f"CREATE VIEW events AS {_EVENTS_V5}",
    ]),
    (6, [
        # a format-4 outcome record carries its attempt's dispatch (ready -> running, and
        # pending -> ready before it): a task row keeps those moves with its success, and
        # that success's attempt and result (``attempts`` and ``results`` are views of
        # attempt_rows, result_rows and those)
        "ALTER TABLE results RENAME TO result_rows",
        "ALTER TABLE attempts RENAME TO attempt_rows",
        # the last move before an attempt row (its place among the kept ones)
        "ALTER TABLE attempt_rows ADD COLUMN after_seq BIGINT",
        *(f"ALTER TABLE tasks ADD COLUMN {col}" for col in V6_COLUMNS),
        f"CREATE OR REPLACE VIEW events AS {EVENTS_VIEW}",
        f"CREATE VIEW results AS {RESULTS_VIEW}",
        f"CREATE VIEW attempts AS {ATTEMPTS_VIEW}",
    ]),
]


def check(con: Any, location: str) -> int:
    """Return the schema version of the open ledger (0: no tables yet).

    Raises:
        NotALedgerError: a DuckDB file holding other tables.
        SchemaVersionError: written by a newer ledgerflow.
    """
    try:    # the common case in one cheap query (the catalog query costs ~4 ms)
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    except duckdb.CatalogException:
        tables = con.execute("SELECT table_name FROM information_schema.tables "
                             "WHERE table_catalog = current_database()").fetchall()
        if not tables:
            return 0
        raise NotALedgerError(f"{location} is a DuckDB file but not a ledgerflow "
                              "ledger (no meta table)", hint=NOT_A_LEDGER) from None
    version = int(row[0][0]) if row else 0
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"ledger {location} was written by a newer ledgerflow (schema version "
            f"{version}; this one reads up to {SCHEMA_VERSION})")
    return version


def migrate(con: Any, location: str) -> int:
    """Bring the ledger open read-write on ``con`` to :data:`SCHEMA_VERSION`."""
    version = check(con, location)
    pending = [(target, sql) for target, statements in MIGRATIONS if target > version
               for sql in statements]
    if not pending:
        return version
    con.execute("BEGIN")
    try:
        for _, sql in pending:
            con.execute(sql)
        version = pending[-1][0]
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(version)])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return version
