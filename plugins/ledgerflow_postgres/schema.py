"""The ledger's tables in PostgreSQL: DDL, ordered migrations, and the schema check.

The tables and the ``lineage`` view have the names and columns of the
DuckDB store's (``runs``, ``tasks``, ``events``, ``attempts``, ``results``,
``artifacts``, ``notices``, ``logs``, ``approval_requests``, ``approval_decisions``,
``steps``; views ``lineage``, ``approvals``), so users' SQL works on either. Added
here: ``id`` identity columns giving the append-only tables their order
(DuckDB's ``rowid``), ``tasks.ord`` (creation order), ``leases`` (who
drives a run, until when, on the server's clock), ``commits`` (the journal:
one row per group commit with its records, keyed by run, token and
sequence, which makes a retried commit a no-op), ``folds`` (how far each
run's commits are folded into the tables) and ``signals`` (cancel requests
and approval decisions from any process). There is no ``journal_damage``: a commit is one
row, written whole or not at all.

Each migration runs in one transaction under an advisory lock, so two
processes opening a new database at once do not both create it. A record
kind the migrations do not know yet (declared by a newer kernel) gets its
table derived from its declaration (:func:`ensure_record_tables`).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from ledgerflow.errors import NotALedgerError, SchemaVersionError
from ledgerflow.records import KINDS, Record, columns, field_types

SCHEMA_VERSION = 1

#: Any 64-bit number: the advisory lock of migrations.
_MIGRATION_LOCK = 0x6C6564676572  # "ledger"

#: The order of an append-only table's rows (DuckDB's rowid); indexed with run_id only.
_APPEND = "id BIGINT GENERATED ALWAYS AS IDENTITY"

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)",
        """CREATE TABLE runs(run_id TEXT PRIMARY KEY, pipeline TEXT, target TEXT,
            params TEXT, options TEXT, state TEXT, reason TEXT,
            created_at DOUBLE PRECISION, ended_at DOUBLE PRECISION, token INTEGER,
            driver_pid INTEGER, driver_host TEXT, max_seq BIGINT)""",
        "CREATE INDEX runs_created ON runs(created_at DESC)",
        """CREATE TABLE tasks(run_id TEXT NOT NULL, task_key TEXT NOT NULL, task_name TEXT,
            node TEXT, item_key TEXT, "position" INTEGER, upstream TEXT[],
            code_version TEXT, state TEXT, attempts INTEGER, budget_base INTEGER,
            started_at DOUBLE PRECISION, ended_at DOUBLE PRECISION, error TEXT,
            fingerprint TEXT, result_hash TEXT, result_kind TEXT, result_data TEXT,
            result_uri TEXT, result_size BIGINT, cached_from TEXT, result_attempt INTEGER,
            ord BIGINT, PRIMARY KEY (run_id, task_key)) WITH (fillfactor = 70)""",
        # no index covers a column that changes on every transition (state, attempts,
        # times): those updates stay heap-only (HOT), which is most of a commit's work
        "CREATE INDEX tasks_cache ON tasks(fingerprint) WHERE fingerprint IS NOT NULL",
        """CREATE TABLE events(run_id TEXT NOT NULL, seq BIGINT, task_key TEXT,
            attempt INTEGER, from_state TEXT, to_state TEXT, reason TEXT,
            ts DOUBLE PRECISION, token INTEGER)""",
        "CREATE INDEX events_run ON events(run_id, seq)",
        f"""CREATE TABLE attempts({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, outcome TEXT, started_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION, error_type TEXT, error_message TEXT, traceback TEXT,
            token INTEGER)""",
        "CREATE INDEX attempts_run ON attempts(run_id, id)",
        f"""CREATE TABLE results({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, fingerprint TEXT, content_hash TEXT, kind TEXT, data TEXT,
            uri TEXT, size BIGINT, cached_from TEXT)""",
        "CREATE INDEX results_run ON results(run_id, id)",
        f"""CREATE TABLE artifacts({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, direction TEXT, uri TEXT, content_hash TEXT, attrs TEXT)""",
        "CREATE INDEX artifacts_run ON artifacts(run_id, id)",
        f"""CREATE TABLE notices({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, kind TEXT, message TEXT, ts DOUBLE PRECISION)""",
        "CREATE INDEX notices_run ON notices(run_id, id)",
        f"""CREATE TABLE logs({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, stream TEXT, text TEXT, dropped BIGINT, token INTEGER)""",
        "CREATE INDEX logs_run ON logs(run_id, task_key, attempt)",
        # approval gates: requests, decisions journaled by drivers, each request's state
        f"""CREATE TABLE approval_requests({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, digest TEXT, action TEXT, summary TEXT, inputs TEXT,
            requested_at DOUBLE PRECISION, deadline DOUBLE PRECISION, on_timeout TEXT,
            approvers TEXT[], note TEXT)""",
        "CREATE INDEX approval_requests_run ON approval_requests(run_id, id)",
        f"""CREATE TABLE approval_decisions({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            digest TEXT, decision TEXT, decided_by TEXT, reason TEXT,
            decided_at DOUBLE PRECISION)""",
        "CREATE INDEX approval_decisions_run ON approval_decisions(run_id, id)",
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
        f"""CREATE TABLE steps({_APPEND}, run_id TEXT NOT NULL, task_key TEXT,
            attempt INTEGER, name TEXT, kind TEXT, data TEXT, content_hash TEXT)""",
        "CREATE INDEX steps_run ON steps(run_id, task_key)",
        # who drives a run: the token fences older drivers; times are the server's
        """CREATE TABLE leases(run_id TEXT PRIMARY KEY, token INTEGER NOT NULL,
            pid INTEGER, host TEXT, pid_start TEXT,
            acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            renewed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            expires_at TIMESTAMPTZ NOT NULL)""",
        # the journal: one row per group commit with its records as written (JSON);
        # (run, token, seq) makes a retried commit a no-op
        """CREATE TABLE commits(run_id TEXT NOT NULL, token INTEGER NOT NULL,
            seq BIGINT NOT NULL, records INTEGER NOT NULL, body TEXT NOT NULL,
            at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, token, seq))""",
        # how far each run's commits are folded into the tables above
        """CREATE TABLE folds(run_id TEXT PRIMARY KEY, token INTEGER NOT NULL,
            seq BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())""",
        # requests to a run's driver from any process: 'cancel', and 'decision' (an
        # approval decision: one per request digest, the first wins; payload its JSON)
        f"""CREATE TABLE signals({_APPEND}, run_id TEXT NOT NULL, kind TEXT NOT NULL,
            task_key TEXT, digest TEXT, payload TEXT, token INTEGER,
            at TIMESTAMPTZ NOT NULL DEFAULT now())""",
        "CREATE INDEX signals_run ON signals(run_id, kind)",
        "CREATE UNIQUE INDEX signals_decision ON signals(run_id, digest) "
        "WHERE kind = 'decision'",
        """CREATE VIEW lineage AS
            SELECT t.run_id, t.task_key, t.result_attempt AS attempt, 'input' AS direction,
                   'task:' || ut.task_key AS uri, ut.result_hash AS content_hash,
                   t.code_version, NULL::TEXT AS attrs
            FROM tasks t CROSS JOIN LATERAL unnest(t.upstream) AS u(up)
            JOIN tasks ut ON ut.run_id = t.run_id AND (ut.task_key = u.up
                 OR (ut.node = u.up AND ut."position" IS NOT NULL))
            UNION ALL
            SELECT run_id, task_key, result_attempt, 'output', 'task:' || task_key,
                   result_hash, code_version, NULL FROM tasks WHERE state = 'succeeded'
            UNION ALL
            SELECT a.run_id, a.task_key, a.attempt, a.direction, a.uri, a.content_hash,
                   t.code_version, a.attrs
            FROM artifacts a LEFT JOIN tasks t USING (run_id, task_key)""",
    ]),
]


#: Statements that make the ledger faster where the server supports them (each is
#: tried in a savepoint; a server built without lz4 keeps the default compression).
OPTIONAL: list[str] = [
    # commits of more than ~2 KB are compressed: lz4 is several times cheaper than
    # pglz, and most commits then stay in the row instead of the TOAST table
    "ALTER TABLE commits ALTER COLUMN body SET COMPRESSION lz4",
]


def _sql_type(ann: Any) -> str:
    """The column type of a record field annotated ``ann``."""
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
        ann = args[0]
    origin = typing.get_origin(ann) or ann
    if origin is bool:
        return "BOOLEAN"
    if origin is int:
        return "BIGINT"
    if origin is float:
        return "DOUBLE PRECISION"
    if origin is list and typing.get_args(ann) in ((str,), ()):
        return "TEXT[]"
    return "TEXT"       # str, and dicts (or other values) as their JSON text


def record_table_ddl(kind: type[Record]) -> list[str]:
    """The table of an append-only record kind, derived from its declaration: the
    ``id`` order, ``run_id``, one column per field, ``token`` if the kind keeps it."""
    hints = field_types(kind)
    cols = ", ".join(f'"{c}" {_sql_type(hints[c])}' for c in columns(kind))
    token = ", token INTEGER" if kind.TOKENED else ""
    return [f"CREATE TABLE IF NOT EXISTS {kind.TABLE}({_APPEND}, run_id TEXT NOT NULL, "
            f"{cols}{token})",
            f"CREATE INDEX IF NOT EXISTS {kind.TABLE}_run ON {kind.TABLE}(run_id, id)"]


def ensure_record_tables(con: Any) -> None:
    """Create the tables of record kinds this release declares and the migrations do
    not (yet) hold, from their declarations (so a new kind needs no hand-written DDL)."""
    for kind in KINDS.values():
        if kind.TABLE is None:
            continue
        if con.execute("SELECT to_regclass(%s) IS NULL", [kind.TABLE]).fetchone()[0]:
            with con.transaction():
                con.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
                for sql in record_table_ddl(kind):
                    con.execute(sql)


def check(con: Any, location: str) -> int:
    """Return the schema version of the database (0: no ledger tables yet).

    Raises:
        NotALedgerError: a ``runs`` table that is not ledgerflow's (no ``meta``).
        SchemaVersionError: written by a newer ledgerflow.
    """
    row = con.execute("SELECT to_regclass('meta') IS NOT NULL, "
                      "to_regclass('runs') IS NOT NULL").fetchone()
    has_meta, has_runs = row
    if not has_meta:
        if has_runs:
            raise NotALedgerError(f"{location} has a 'runs' table but is not a ledgerflow "
                                  "ledger (no meta table)",
                                  hint="use another database, or set search_path with "
                                  "?options=-csearch_path%3Dledgerflow in the URL")
        return 0
    got = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(got[0]) if got else 0
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"ledger {location} has schema version {version}; this ledgerflow "
            f"reads up to {SCHEMA_VERSION}")
    return version


def migrate(con: Any, location: str) -> int:
    """Bring the database on ``con`` (autocommit) to :data:`SCHEMA_VERSION`."""
    if check(con, location) == SCHEMA_VERSION:
        ensure_record_tables(con)
        return SCHEMA_VERSION
    with con.transaction():
        con.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
        version = check(con, location)      # another process may have done it meanwhile
        for target, statements in MIGRATIONS:
            if target <= version:
                continue
            for sql in statements:
                con.execute(sql)
            con.execute("INSERT INTO meta VALUES ('schema_version', %s) ON CONFLICT (key) "
                        "DO UPDATE SET value = EXCLUDED.value", [str(target)])
            version = target
        for sql in OPTIONAL:
            try:
                with con.transaction():     # a savepoint
                    con.execute(sql)
            except Exception:  # an optional speed-up the server does not have
                pass
    ensure_record_tables(con)
    return version
