"""The ``postgres`` store: one ledger in a PostgreSQL database shared by many machines.

Writing: a journal and a fold, as in the DuckDB store, with the database as
the journal. A group commit is one small statement (:mod:`.sql`): it checks
the run's lease token under a share lock on the lease row and inserts one
``commits`` row keyed by ``(run, token, seq)`` holding the commit's records;
that insert is the durability point. A stale driver writes nothing, and a
commit sent again after a lost connection (whose outcome the client cannot
know) is a no-op: before sending it again the store checks whether it
landed. A background thread **folds** committed rows into the tables
(``events``, ``attempts``, ``tasks``, ...) every half second or every few
thousand records, set-based, in one fenced statement per fold: the driver
keeps the current state of the runs it drives in memory (a
:class:`~ledgerflow.views.RunView` per leased run, loaded at creation or
takeover), applies :func:`ledgerflow.projection.apply` to the rows each
commit touches, and the fold upserts those rows as of its last commit.

Reading: in one snapshot, the tables plus the run's commits not folded yet,
applied with :func:`ledgerflow.projection.apply`; so every process reads
exactly what was committed. The tables themselves (users' SQL, the
``lineage`` view) lag a live run by at most one fold, and a crashed run's
tail is folded by whoever takes the run over.

Waiting. Every operation waits for a database that went away
(:meth:`.connection.Database.retrying`, ``LEDGERFLOW_STORE_WAIT`` seconds,
20 by default) and then raises ``StoreUnavailableError``; a run interrupted
so is finished by ``pipeline resume``. Leases (:mod:`.lease`) expire on the
server's clock after ``LEDGERFLOW_LEASE_TTL`` seconds (30) and are renewed
every third of that; a driver that cannot renew in time stops itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

from ledgerflow.errors import (
    ApprovalConflictError,
    LeaseLostError,
    NotResumableError,
    RunNotFoundError,
    StoreError,
)
from ledgerflow.ledger import RecordReads, matching
from ledgerflow.projection import apply
from ledgerflow.records import (
    KINDS,
    AnyRecord,
    AttemptEnded,
    Record,
    ResultRecorded,
    RunDefined,
    TaskCreated,
    Transition,
    encode_line,
)
from ledgerflow.states import RUN_ACTIVE
from ledgerflow.store import CacheHit, Lease
from ledgerflow.views import RunView, TaskRow

from . import queries, schema
from .blobs import shared_blobs
from .connection import DEFAULT_WAIT, Database, is_connection_error
from .lease import DEFAULT_TTL, RUNS_CHANNEL, SIGNALS_CHANNEL, Keeper, holder, holder_gone
from .sql import COMMIT_SQL, RUN_FIELDS, commit_params, fold_params, run_tuple

log = logging.getLogger("ledgerflow")
R = TypeVar("R", bound=Record)
_ACTIVE = tuple(s.value for s in RUN_ACTIVE)
_ROW_KINDS = (Transition, TaskCreated, AttemptEnded, ResultRecorded)

#: A fold runs at least this often while a run has unfolded commits (seconds) ...
FOLD_INTERVAL = 0.5
#: ... and at once when this many records wait.
FOLD_RECORDS = 4096


@dataclass(slots=True)
class Mirror:
    """A run this store drives: its committed state, and what is not folded yet."""

    token: int
    view: RunView
    seq: int = 0                    # the last group commit's sequence under ``token``
    next_ord: int = 0               # creation order of the next new task
    folded: tuple[int, int] = (0, 0)        # commits folded up to (token, seq)
    pending: dict[str, TaskRow] = field(default_factory=dict)   # rows as of ``seq``
    ords: dict[str, int] = field(default_factory=dict)          # new tasks' orders
    run_changed: bool = False
    records: int = 0                # records committed and not folded
    unsure: bool = False            # a fold's outcome is unknown (lost connection)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StoreError(f"{name} must be a number of seconds, given: {raw!r}",
                         hint=f"set {name}=30 or unset it") from None
    if value <= 0:
        raise StoreError(f"{name} must be positive, given: {raw!r}",
                         hint=f"set {name}=30 or unset it")
    return value


_task_fields = attrgetter(*TaskRow.__dataclass_fields__)
_run_fields = attrgetter(*RUN_FIELDS)


def _clone_view(view: RunView) -> RunView:
    """A RunView with ``view``'s own row and no tasks (copy.copy is several times slower)."""
    return RunView(**dict(zip(RUN_FIELDS, _run_fields(view), strict=True)))


@contextlib.contextmanager
def _snapshot(con: Any) -> Iterator[None]:
    """A read-only REPEATABLE READ transaction on an autocommit connection."""
    con.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        yield
    finally:
        con.execute("ROLLBACK")


class _QuietPool(logging.Filter):
    """Drops the reader pool's own reconnect warnings (the store says it once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "'ledgerflow-readers'" not in record.getMessage()


logging.getLogger("psycopg.pool").addFilter(_QuietPool())


class PostgresStore(RecordReads):
    """The ledger in a PostgreSQL database (see the module docstring).

    Args:
        url: a libpq URL (``postgresql://user@host:5432/db``); give the password
            through ``PGPASSWORD`` or ``~/.pgpass``, not in the URL.
        lease_ttl: seconds a lease lives unrenewed (default ``LEDGERFLOW_LEASE_TTL`` or 30).
        wait: seconds to wait for a database that went away (``LEDGERFLOW_STORE_WAIT``, 20).
        blob_dir: where large results go (``LEDGERFLOW_BLOB_DIR``; see :mod:`.blobs`).
    """

    name = "postgres"

    def __init__(self, url: str, *, lease_ttl: float | None = None, wait: float | None = None,
                 blob_dir: str | Path | None = None) -> None:
        self.location = url
        self.ttl = lease_ttl if lease_ttl is not None else _env_float(
            "LEDGERFLOW_LEASE_TTL", DEFAULT_TTL)
        self.db = Database(url, wait=wait if wait is not None else _env_float(
            "LEDGERFLOW_STORE_WAIT", DEFAULT_WAIT))
        self.blobs = shared_blobs(Path(blob_dir).expanduser().resolve()
                                  if blob_dir is not None else None)
        self.keeper = Keeper(self.db, self.ttl)
        self._wlock = threading.RLock()      # the writer connection and the mirrors
        self._wconn: Any = None
        self._flock = threading.RLock()      # the fold connection; one fold at a time
        self._fconn: Any = None
        self._pool: Any = None
        self._pool_lock = threading.Lock()
        self._migrated = False
        self._mirrors: dict[str, Mirror] = {}
        self._claimed: dict[str, Lease] = {}
        self._fold_wake = threading.Event()
        self._folder: threading.Thread | None = None

    # -- connections ----------------------------------------------------------------------
    def _prepare(self, con: Any) -> None:
        if not self._migrated:
            schema.migrate(con, self.db.shown)
            self._migrated = True

    def _writer(self) -> Any:
        if self._wconn is None or self._wconn.closed:
            self._wconn = self.db.connect()
            self._prepare(self._wconn)
        return self._wconn

    @staticmethod
    def _close(conn: Any) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):    # a broken connection is gone anyway
                conn.close()

    def _reset_writer(self) -> None:
        conn, self._wconn = self._wconn, None
        self._close(conn)

    def _folder_conn(self) -> Any:
        if self._fconn is None or self._fconn.closed:
            self._fconn = self.db.connect()
            self._prepare(self._fconn)
        return self._fconn

    def _reset_folder(self) -> None:
        conn, self._fconn = self._fconn, None
        self._close(conn)

    def _readers(self) -> Any:
        with self._pool_lock:
            if self._pool is None:
                from psycopg_pool import ConnectionPool
                self._pool = ConnectionPool(
                    self.location, min_size=0, max_size=4, open=True,
                    check=ConnectionPool.check_connection, name="ledgerflow-readers",
                    kwargs={"autocommit": True, "application_name": "ledgerflow",
                            "connect_timeout": max(1, int(min(self.db.wait, 5)))})
            return self._pool

    def _read(self, fn: Any, what: str, *, snapshot: bool = True) -> Any:
        """``fn(con)`` on a pooled connection, in one read-only snapshot (a REPEATABLE
        READ transaction) unless ``snapshot=False`` (small writes in autocommit)."""
        from psycopg_pool import PoolTimeout

        def attempt(retry: bool) -> Any:
            if not self._migrated:
                with self._wlock:
                    self._writer()      # the first use connects directly: real errors
            try:
                with self._readers().connection(
                        timeout=max(1.0, min(self.db.wait, 5.0))) as con:
                    if not snapshot:
                        return fn(con)
                    with _snapshot(con):
                        return fn(con)
            except PoolTimeout:
                # the pool only says it got no connection: a direct one says why
                self.db.connect(timeout=2).close()
                raise
        return self.db.retrying(attempt, what=what)

    # -- writing --------------------------------------------------------------------------
    def create_run(self, run_id: str, records: Sequence[Record]) -> Lease:
        pid, host, start = holder()
        mirror = Mirror(1, RunView(run_id))
        scratch, rows, _, next_ord = self._project(mirror, records)
        body = encode_line(records)[:-1]
        # the run's first commit is folded at once: every run has its rows from the start
        fsql, fparams = fold_params(run_id, 1, (0, 0), (1, 1), rows, scratch)
        sent = [0.0]

        def attempt(retry: bool) -> None:
            con = self._writer()
            if retry and con.execute("SELECT 1 FROM commits WHERE run_id = %s AND token = 1 "
                                     "AND seq = 1", [run_id]).fetchone():
                return      # the first try landed
            sent[0] = time.monotonic()
            with con.transaction():
                made = con.execute(
                    "INSERT INTO leases (run_id, token, pid, host, pid_start, expires_at) "
                    "VALUES (%s, 1, %s, %s, %s, now() + make_interval(secs => %s)) "
                    "ON CONFLICT DO NOTHING RETURNING 1",
                    [run_id, pid, host, start, self.ttl]).fetchone()
                if made is None:
                    raise StoreError(f"run {run_id} already exists in {self.db.shown}",
                                     hint="start it with a new run id")
                con.execute(COMMIT_SQL, commit_params(run_id, 1, 1, body, len(records)))
                con.execute("INSERT INTO folds (run_id, token, seq) VALUES (%s, 0, 0)",
                            [run_id])
                con.execute(fsql, fparams)

        with self._wlock:
            self.db.retrying(attempt, what=f"creating run {run_id}",
                             reset=self._reset_writer)
            self._commit_mirror(mirror, scratch, 1, next_ord)
            mirror.folded = (1, 1)
            self._mirrors[run_id] = mirror
        self.keeper.hold(run_id, 1, sent[0] or time.monotonic())
        return Lease(run_id, 1)

    def take_over(self, run_id: str) -> Lease:
        with self._wlock:
            claimed = self._claimed.pop(run_id, None)
            if claimed is not None:     # a worker's claim already took it
                return claimed
        pid, host, start = holder()
        sent = [0.0]

        def attempt(retry: bool) -> int:
            con = self._writer()
            with con.transaction():
                row = con.execute(
                    "SELECT token, pid, host, pid_start, expires_at <= now(), "
                    "extract(epoch FROM expires_at - now()) FROM leases WHERE run_id = %s "
                    "FOR UPDATE", [run_id]).fetchone()
                if row is None:
                    raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
                token, lpid, lhost, lstart, expired, left = row
                mine = (lpid, lhost, lstart) == (pid, host, start)
                if retry and mine and run_id not in self.keeper.held:
                    return int(token)   # the first try took it before the connection broke
                if not expired and not holder_gone(lpid, lhost, lstart):
                    raise NotResumableError(
                        f"run {run_id} is still being driven by pid {lpid} on {lhost} "
                        f"(its lease expires in {max(0.0, float(left)):.0f}s unless renewed)",
                        hint=f"wait for it, or stop it first: pipeline cancel {run_id}")
                sent[0] = time.monotonic()
                con.execute(
                    "UPDATE leases SET token = %s, pid = %s, host = %s, pid_start = %s, "
                    "acquired_at = now(), renewed_at = now(), "
                    "expires_at = now() + make_interval(secs => %s) WHERE run_id = %s",
                    [token + 1, pid, host, start, self.ttl, run_id])
                return int(token) + 1

        with self._wlock:
            token = self.db.retrying(attempt, what=f"taking over run {run_id}",
                                     reset=self._reset_writer)
        self.keeper.hold(run_id, token, sent[0] or time.monotonic())
        self._adopt(run_id, token)
        return Lease(run_id, token)

    def _adopt(self, run_id: str, token: int) -> None:
        """Load the committed state of a run this store now drives, and fold what the
        previous driver left unfolded (its rows are the loaded state's)."""
        def load(con: Any) -> tuple[RunView, set[str], int, tuple[int, int], list[Any]]:
            got = queries.load_run(con, run_id)
            tail = queries.tail(con, run_id)
            view = got[0] if got is not None else RunView(run_id)
            if got is None and not any(isinstance(r, RunDefined) for _, _, rs in tail
                                       for r in rs):
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            in_tables = set(view.tasks)
            for _, _, rs in tail:
                apply(view, rs)
            return (view, in_tables, queries.next_ord(con, run_id),
                    queries.folded_to(con, run_id), tail)
        view, in_tables, next_ord, folded, tail = self._read(load, f"loading run {run_id}")
        mirror = Mirror(token, view, 0, next_ord, folded)
        if tail:
            self._stage_tail(mirror, tail, in_tables)
            if not self._fold(mirror, end=(tail[-1][0], tail[-1][1])):
                raise LeaseLostError(f"lease lost: run {run_id} was taken over while this "
                                     "driver took it over")
        with self._wlock:
            self._mirrors[run_id] = mirror

    def claim(self, skip: Collection[str] = ()) -> Lease | None:
        """Take the lease of the oldest run that waits for a driver (``pipeline worker``).

        A run waits when it is ``submitted``, or ``running``/``cancelling`` with
        an expired lease (its driver died). Rows other workers are claiming
        are skipped (``FOR UPDATE SKIP LOCKED``). The lease is held (renewed)
        from here on; :meth:`take_over` of that run returns it.
        """
        pid, host, start = holder()
        sent = [0.0]

        def attempt(retry: bool) -> tuple[str, int] | None:
            con = self._writer()
            sent[0] = time.monotonic()
            row = con.execute(
                "WITH cand AS (SELECT l.run_id FROM leases l JOIN runs r USING (run_id) "
                "WHERE r.state = ANY(%(active)s) AND l.expires_at <= now() "
                "AND NOT (l.run_id = ANY(%(skip)s)) ORDER BY r.created_at LIMIT 1 "
                "FOR UPDATE OF l SKIP LOCKED) "
                "UPDATE leases l SET token = l.token + 1, pid = %(pid)s, host = %(host)s, "
                "pid_start = %(start)s, acquired_at = now(), renewed_at = now(), "
                "expires_at = now() + make_interval(secs => %(ttl)s) FROM cand "
                "WHERE l.run_id = cand.run_id RETURNING l.run_id, l.token",
                {"active": list(_ACTIVE), "skip": list(skip), "pid": pid, "host": host,
                 "start": start, "ttl": self.ttl}).fetchone()
            return None if row is None else (row[0], int(row[1]))

        with self._wlock:
            got = self.db.retrying(attempt, what="claiming a run", reset=self._reset_writer)
        if got is None:
            return None
        run_id, token = got
        self.keeper.hold(run_id, token, sent[0])
        self._adopt(run_id, token)
        lease = Lease(run_id, token)
        with self._wlock:
            self._claimed[run_id] = lease
        return lease

    def _project(self, mirror: Mirror, records: Sequence[Record]
                 ) -> tuple[RunView, list[tuple[TaskRow, int]], bool, int]:
        """The rows ``records`` touch, after them (the mirror is not changed)."""
        base = mirror.view
        scratch = _clone_view(base)
        for rec in records:
            if type(rec) in _ROW_KINDS:
                key = rec.task_key  # type: ignore[attr-defined]
                if key not in scratch.tasks:
                    old = base.tasks.get(key)
                    if old is not None:
                        scratch.tasks[key] = TaskRow(*_task_fields(old))
        apply(scratch, records)
        ord_ = mirror.next_ord
        rows: list[tuple[TaskRow, int]] = []
        for key, row in scratch.tasks.items():
            if key in base.tasks:
                rows.append((row, -1))      # the upsert keeps its creation order
            else:
                rows.append((row, ord_))
                ord_ += 1
        return scratch, rows, run_tuple(scratch) != run_tuple(base), ord_

    @staticmethod
    def _commit_mirror(mirror: Mirror, scratch: RunView, seq: int, next_ord: int) -> None:
        mirror.view.tasks.update(scratch.tasks)
        for f in RUN_FIELDS:
            setattr(mirror.view, f, getattr(scratch, f))
        mirror.seq = seq
        mirror.next_ord = next_ord

    def _lost(self, lease: Lease) -> LeaseLostError:
        return LeaseLostError(
            f"lease lost: {self.keeper.lost(lease.run_id, lease.token) or 'superseded'}",
            hint=f"the run is driven elsewhere or resumable: pipeline status {lease.run_id}")

    def append(self, lease: Lease, records: Sequence[Record]) -> None:
        if not records:
            return
        run_id = lease.run_id
        if self.keeper.lost(run_id, lease.token) is not None:
            raise self._lost(lease)
        with self._wlock:
            mirror = self._mirrors.get(run_id)
            if mirror is None or mirror.token != lease.token:
                raise LeaseLostError(
                    f"lease lost: run {run_id} token {lease.token} is not held here any more "
                    "(taken over or released)",
                    hint=f"watch it with: pipeline status {run_id}")
            scratch, rows, run_changed, next_ord = self._project(mirror, records)
            seq = mirror.seq + 1
            params = commit_params(run_id, lease.token, seq, encode_line(records)[:-1],
                                   len(records))
            check = "SELECT 1 FROM commits WHERE run_id = %s AND token = %s AND seq = %s"

            def attempt(retry: bool) -> bool:
                con = self._writer()
                if retry and con.execute(check, [run_id, lease.token, seq]).fetchone():
                    return True         # it landed before the connection broke
                if con.execute(COMMIT_SQL, params).fetchone() is not None:
                    return True
                # nothing written: the lease is not ours, or this very commit exists
                return con.execute(check, [run_id, lease.token, seq]).fetchone() is not None

            landed = self.db.retrying(
                attempt, what=f"committing to run {run_id}", reset=self._reset_writer,
                fenced=lambda: self.keeper.lost(run_id, lease.token),
                hint=f"start the database, then: pipeline resume {run_id}")
            if not landed:
                self._fenced(run_id, lease.token, "its commit was refused and nothing was "
                             "written")
                raise self._lost(lease)
            self._commit_mirror(mirror, scratch, seq, next_ord)
            for row, ord_ in rows:
                mirror.pending[row.key] = row
                if ord_ >= 0:
                    mirror.ords[row.key] = ord_
            mirror.run_changed = mirror.run_changed or run_changed
            mirror.records += len(records)
            if mirror.records >= FOLD_RECORDS:
                self._fold_wake.set()
            self._start_folder()

    def _fenced(self, run_id: str, token: int, what: str) -> None:
        held = self.keeper.held.get(run_id)
        if held is not None and held.token == token and held.lost is None:
            held.lost = (f"run {run_id} was taken over by another driver; this driver's "
                         f"token {token} is stale, so {what}")

    # -- folding --------------------------------------------------------------------------
    def _fold(self, mirror: Mirror, *, end: tuple[int, int] | None = None,
              wait: bool = True) -> bool:
        """Fold ``mirror``'s committed, unfolded commits into the tables (one statement).

        Returns False if the lease is not this driver's any more (nothing written).
        ``wait=False``: one try (connection errors leave the commits for later).
        A fold whose outcome was lost with the connection is checked first: the
        fold position says whether it landed (the statement is a compare-and-set
        on it), so nothing is folded twice.
        """
        run_id = mirror.view.run_id
        with self._flock:
            with self._wlock:
                if not mirror.records and end is None and not mirror.unsure:
                    return True
                start, stop = mirror.folded, end or (mirror.token, mirror.seq)
                rows = [(row, mirror.ords.get(key, -1)) for key, row in mirror.pending.items()]
                run = _clone_view(mirror.view) if mirror.run_changed else None
                taken = (mirror.pending, mirror.ords, mirror.run_changed, mirror.records)
                mirror.pending, mirror.ords, mirror.run_changed, mirror.records = (
                    {}, {}, False, 0)

            def attempt(retry: bool) -> bool:
                con = self._folder_conn()
                begin = start
                if retry or mirror.unsure:
                    pos = queries.folded_to(con, run_id)
                    if pos == stop:
                        return True     # it landed before the connection broke
                    begin = max(begin, pos)     # an earlier fold of a part landed
                sql, params = fold_params(run_id, mirror.token, begin, stop, rows, run)
                row = con.execute(sql, params).fetchone()
                if row and row[0]:
                    return True
                # not applied: the lease is not this driver's (or it landed after all)
                return bool(queries.folded_to(con, run_id) == stop)

            try:
                if wait:
                    ok = self.db.retrying(attempt, what=f"folding run {run_id}",
                                          reset=self._reset_folder)
                else:
                    ok = attempt(False)
            except Exception as exc:
                with self._wlock:       # not folded: keep it for the next fold
                    mirror.pending = {**taken[0], **mirror.pending}
                    mirror.ords = {**taken[1], **mirror.ords}
                    mirror.run_changed = mirror.run_changed or taken[2]
                    mirror.records += taken[3]
                if is_connection_error(exc):
                    self._reset_folder()
                    mirror.unsure = True    # the next fold checks whether this one landed
                    return True
                raise
            mirror.unsure = False
            if not ok:
                self._fenced(run_id, mirror.token, "it stopped")
                return False
            mirror.folded = stop
            return True

    def _start_folder(self) -> None:
        if self._folder is None or not self._folder.is_alive():
            self._folder = threading.Thread(target=self._fold_loop, daemon=True,
                                            name="ledgerflow-pg-fold")
            self._folder.start()

    def _fold_loop(self) -> None:
        """Fold every held run's commits every FOLD_INTERVAL (sooner when many wait)."""
        while True:
            self._fold_wake.wait(FOLD_INTERVAL)
            self._fold_wake.clear()
            with self._wlock:
                mirrors = [m for m in self._mirrors.values() if m.records]
                if not self._mirrors:
                    self._folder = None
                    return
            for m in mirrors:
                try:
                    self._fold(m, wait=False)
                except Exception:   # the fold at release reports what is still wrong
                    log.warning("ledgerflow: background fold of run %s failed",
                                m.view.run_id, exc_info=True)

    def lease_lost(self, lease: Lease) -> str | None:
        """Why this process lost ``lease`` (None while it holds): the runner polls this."""
        return self.keeper.lost(lease.run_id, lease.token)

    def release(self, lease: Lease) -> None:
        with self._wlock:
            mirror = self._mirrors.get(lease.run_id)
            if mirror is None or mirror.token != lease.token:
                mirror = None
            self._claimed.pop(lease.run_id, None)
        lost = self.keeper.lost(lease.run_id, lease.token)
        if mirror is not None and lost is None:
            try:     # once, without waiting: what is left unfolded is folded by the next
                self._fold(mirror, wait=False)   # driver, and read from the commits meanwhile
            except Exception as exc:
                log.warning("ledgerflow: could not fold run %s at release: %s",
                            lease.run_id, exc)
        held = self.keeper.drop(lease.run_id)
        with self._wlock:
            if mirror is not None:
                self._mirrors.pop(lease.run_id, None)
            if held is None or held.token != lease.token or held.lost is not None:
                return      # not ours any more: write nothing
            try:    # once, without waiting: an unreleased lease expires by itself
                self._writer().execute(
                    "WITH u AS (UPDATE leases SET expires_at = now() WHERE run_id = %s "
                    "AND token = %s RETURNING run_id) "
                    f"SELECT pg_notify('{RUNS_CHANNEL}', run_id) FROM u",
                    [lease.run_id, lease.token])
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                self._reset_writer()

    # -- reading --------------------------------------------------------------------------
    @staticmethod
    def _alive(view: RunView, lease: tuple[Any, ...]) -> bool:
        unexpired, pid, host, start = lease
        return bool(view.state in _ACTIVE and unexpired and not holder_gone(pid, host, start))

    def _merged(self, con: Any, run_id: str, *, tasks: bool = True,
                upstream: bool = True) -> tuple[RunView, list[AnyRecord]]:
        """The run as committed: its rows plus its unfolded commits (and those records)."""
        got = queries.load_run(con, run_id, tasks=tasks, upstream=upstream)
        if got is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
        view, lease = got
        tail = [r for _, _, rs in queries.tail(con, run_id) for r in rs]
        if tail:
            apply(view, tail)
            if not tasks:
                view.tasks = {}
        view.driver_alive = self._alive(view, lease)
        return view, tail

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        return self._read(  # type: ignore[no-any-return]
            lambda con: self._merged(con, run_id, tasks=tasks, upstream=upstream)[0],
            f"reading run {run_id}")

    def list_runs(self, limit: int = 50) -> list[RunView]:
        def read(con: Any) -> list[RunView]:
            out = []
            for view, _ in queries.list_runs(con, limit):
                if view.state in _ACTIVE:   # its last commits may not be folded yet
                    view = self._merged(con, view.run_id, upstream=False)[0]
                    view.task_counts = view.counts()
                    view.tasks = {}
                else:
                    view.driver_alive = False
                out.append(view)
            return out
        return self._read(read, "listing runs")  # type: ignore[no-any-return]

    def request_cancel(self, run_id: str) -> None:
        def send(con: Any) -> bool:
            row = con.execute(
                "WITH s AS (INSERT INTO signals (run_id, kind, token) "
                "SELECT l.run_id, 'cancel', l.token FROM leases l JOIN runs r USING (run_id) "
                "WHERE l.run_id = %s RETURNING run_id) "
                f"SELECT pg_notify('{SIGNALS_CHANNEL}', run_id) FROM s", [run_id]).fetchone()
            return row is not None
        if not self._read(send, f"cancelling run {run_id}", snapshot=False):
            raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
        self.keeper.mark_cancel(run_id)

    def cancel_requested(self, run_id: str) -> bool:
        local = self.keeper.cancelled(run_id)
        if local is not None:
            return local
        return bool(self._read(lambda con: con.execute(
            "SELECT 1 FROM signals s JOIN leases l USING (run_id) WHERE s.run_id = %s "
            "AND s.kind = 'cancel' AND s.token >= l.token LIMIT 1", [run_id]).fetchone(),
            f"reading run {run_id}"))

    # -- the shared read side's primitives (see :class:`ledgerflow.ledger.RecordReads`) ---
    def _cache_read(self, names: list[str], exclude_run: str | None,
                    limit: int | None) -> dict[str, CacheHit] | set[str]:
        return self._read(  # type: ignore[no-any-return]
            lambda con: queries.CACHED.read(con, names, exclude_run, limit),
            "reading the cache")

    def _kind_rows(self, run_id: str, kind: type[R], *, task_key: str | None = None,
                   attempt: int | None = None) -> list[R]:
        """The rows of an append-only kind: folded ones, then the unfolded commits'."""
        def read(con: Any) -> list[R]:
            if not queries.has_run(con, run_id):
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            rows: list[R] = queries.record_rows(con, run_id, kind, task_key=task_key,
                                                attempt=attempt)
            for _, _, rs in queries.tail(con, run_id):
                rows += matching(rs, kind, task_key, attempt)
            return rows
        return self._read(read, f"reading run {run_id}")  # type: ignore[no-any-return]

    def _side_decisions(self, run_id: str) -> list[dict[str, Any]]:
        """Decisions made by any process: the ``signals`` rows."""
        def read(con: Any) -> list[dict[str, Any]]:
            return [json.loads(p) for (p,) in con.execute(
                "SELECT payload FROM signals WHERE run_id = %s AND kind = 'decision' "
                "ORDER BY id", [run_id])]
        return self._read(read, f"reading run {run_id}")  # type: ignore[no-any-return]

    # -- approvals and steps -------------------------------------------------------------
    def decide(self, run_id: str, task_key: str, digest: str, decision: str, by: str,
               reason: str) -> dict[str, Any]:
        """Record a decision on an approval request from any process: a ``signals`` row
        (unique per request digest: the first decider wins) and a NOTIFY."""
        doc = {"task_key": task_key, "digest": digest, "decision": decision,
               "decided_by": by, "reason": reason, "decided_at": time.time()}

        def send(con: Any) -> dict[str, Any] | None:
            if not queries.has_run(con, run_id):
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            row = con.execute(
                "WITH s AS (INSERT INTO signals (run_id, kind, task_key, digest, payload, "
                "token) SELECT run_id, 'decision', %s, %s, %s, token FROM leases "
                "WHERE run_id = %s ON CONFLICT (run_id, digest) WHERE kind = 'decision' "
                f"DO NOTHING RETURNING run_id) SELECT pg_notify('{SIGNALS_CHANNEL}', run_id) "
                "FROM s", [task_key, digest, json.dumps(doc), run_id]).fetchone()
            if row is not None:
                return None
            other = con.execute("SELECT payload FROM signals WHERE run_id = %s AND "
                                "kind = 'decision' AND digest = %s", [run_id, digest]).fetchone()
            return json.loads(other[0]) if other else {"decision": "decided",
                                                        "decided_by": "another process"}
        other = self._read(send, f"deciding on run {run_id}", snapshot=False)
        if other is not None:
            raise ApprovalConflictError(
                f"the request {digest[:12]} of {task_key} was already "
                f"{other['decision']} by {other['decided_by']}",
                hint=f"see it with: pipeline approvals {run_id}")
        self.keeper.add_decision(run_id, doc)
        return doc

    def approval_decisions(self, run_id: str) -> list[dict[str, Any]]:
        held = self.keeper.decisions(run_id)
        if held is not None:       # polled by the runner: from the keeper's memory
            return held
        return super().approval_decisions(run_id)

    # -- recovery -------------------------------------------------------------------------
    def _dead_tails(self, con: Any) -> list[tuple[str, int]]:
        """Runs whose driver is gone (lease expired) with commits not folded yet."""
        return [(r, int(t)) for r, t in con.execute(
            "SELECT l.run_id, l.token FROM leases l JOIN folds f USING (run_id) "
            "WHERE l.expires_at <= now() AND EXISTS (SELECT 1 FROM commits c "
            "WHERE c.run_id = l.run_id AND (c.run_id, c.token, c.seq) > "
            "(f.run_id, f.token, f.seq))").fetchall()]

    def recover(self) -> None:
        """Fold what drivers that are gone left unfolded (the tables and the cache
        index catch up); a takeover does it too."""
        self._recover()

    def _recover(self) -> list[str]:
        done = []
        for run_id, token in self._read(self._dead_tails, "reading the ledger"):
            with self._wlock:
                if run_id in self._mirrors:
                    continue
            try:
                if self._fold_tail(run_id, token):
                    done.append(run_id)
            except RunNotFoundError:
                continue
        return done

    def _fold_tail(self, run_id: str, token: int) -> bool:
        """Fold a run's unfolded commits under its current (expired) lease token."""
        def load(con: Any) -> tuple[RunView, set[str], int, tuple[int, int], list[Any]]:
            got = queries.load_run(con, run_id)
            if got is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            view = got[0]
            in_tables = set(view.tasks)
            tail = queries.tail(con, run_id)
            for _, _, rs in tail:
                apply(view, rs)
            return (view, in_tables, queries.next_ord(con, run_id),
                    queries.folded_to(con, run_id), tail)
        view, in_tables, next_ord, folded, tail = self._read(load, f"loading run {run_id}")
        if not tail:
            return False
        mirror = Mirror(token, view, 0, next_ord, folded)
        self._stage_tail(mirror, tail, in_tables)
        return self._fold(mirror, end=(tail[-1][0], tail[-1][1]), wait=False)

    @staticmethod
    def _stage_tail(mirror: Mirror, tail: list[Any], in_tables: set[str]) -> None:
        """Make a loaded tail the mirror's pending fold (rows as of its last commit)."""
        view = mirror.view
        touched = {r.task_key for _, _, rs in tail for r in rs
                   if type(r) in _ROW_KINDS}
        mirror.pending = {k: view.tasks[k] for k in touched}
        for k in view.tasks:        # the tail's new tasks, in creation order
            if k in touched and k not in in_tables:
                mirror.ords[k] = mirror.next_ord
                mirror.next_ord += 1
        mirror.run_changed = True
        mirror.records = sum(len(rs) for _, _, rs in tail)

    def fold(self) -> list[str]:
        """Fold now: the runs this store drives, and what gone drivers left; returns the
        runs folded (``pipeline fold``)."""
        with self._wlock:
            mirrors = list(self._mirrors.values())
        done = [m.view.run_id for m in mirrors if m.records and self._fold(m)]
        return done + self._recover()

    def doctor(self) -> list[dict[str, Any]]:
        """What is wrong with the ledger, in plain words (``pipeline doctor``)."""
        def read(con: Any) -> list[dict[str, Any]]:
            version = schema.check(con, self.db.shown)
            n = con.execute("SELECT count(*) FROM runs").fetchone()[0]
            out = [{"problem": False, "what": f"postgres ledger {self.db.shown}: schema "
                    f"version {version}, {n} run(s)", "fix": ""}]
            for run_id, _ in self._dead_tails(con):
                out.append({"problem": True, "what": f"run {run_id}: its driver is gone "
                            "and left commits not folded into the tables (reads include "
                            "them; SQL on the tables does not)",
                            "fix": f"pipeline fold --store ...  (or: pipeline resume {run_id})"})
            for run_id, state in con.execute(
                    "SELECT r.run_id, r.state FROM runs r JOIN leases l USING (run_id) "
                    "WHERE r.state = ANY(%s) AND l.expires_at <= now() "
                    "ORDER BY r.created_at", [list(_ACTIVE)]).fetchall():
                out.append({"problem": False, "what": f"run {run_id} is {state} with no "
                            "driver (resumable)", "fix": f"pipeline resume {run_id}"})
            missing = [(r, k, u) for r, k, u in con.execute(
                "SELECT run_id, task_key, result_uri FROM tasks WHERE state = 'succeeded' "
                "AND result_uri IS NOT NULL").fetchall() if not self.blob_exists(u)]
            for run_id, key, uri in missing[:20]:
                out.append({"problem": True, "what": f"run {run_id} task {key}: result file "
                            f"{self.blobs.path(uri)} is missing",
                            "fix": "set LEDGERFLOW_BLOB_DIR to the shared result directory, "
                            f"or: pipeline resume {run_id} (the task runs again)"})
            return out
        return self._read(read, "checking the ledger")  # type: ignore[no-any-return]

    def repair(self) -> tuple[str, list[str]]:
        """Rebuild every run's rows from its commits (the journal), in place.

        Refused while any run is driven. Nothing is copied aside: the commits, the
        source of truth, are not changed.
        """
        def runs(con: Any) -> list[tuple[str, int, bool]]:
            return [(r, int(t), bool(live)) for r, t, live in con.execute(
                "SELECT run_id, token, expires_at > now() FROM leases ORDER BY run_id")]
        notes: list[str] = []
        all_runs = self._read(runs, "reading the ledger")
        live = [r for r, _, alive in all_runs if alive]
        if live:
            raise StoreError(f"run {live[0]} is being driven; repair rewrites every run's rows",
                             hint="wait for the runs to end (pipeline runs), then repair")
        for run_id, token, _ in all_runs:
            self._rebuild(run_id, token)
            notes.append(f"run {run_id}: rebuilt from its commits")
        return "", notes

    def _rebuild(self, run_id: str, token: int) -> None:
        def attempt(retry: bool) -> None:
            con = self._folder_conn()
            with con.transaction():
                if con.execute("SELECT 1 FROM leases WHERE run_id = %s AND token = %s "
                               "AND expires_at <= now() FOR UPDATE",
                               [run_id, token]).fetchone() is None:
                    raise StoreError(f"run {run_id} was taken over during the repair",
                                     hint="run pipeline repair again once it ended")
                commits = queries.tail_from(con, run_id, (0, 0))
                view = RunView(run_id)
                for _, _, rs in commits:
                    apply(view, rs)
                for table in ("tasks", *sorted({k.TABLE for k in KINDS.values()
                                                if k.TABLE})):
                    con.execute(f"DELETE FROM {table} WHERE run_id = %s", [run_id])
                con.execute("UPDATE folds SET token = 0, seq = 0 WHERE run_id = %s", [run_id])
                if not commits:
                    return
                end = (commits[-1][0], commits[-1][1])
                rows = [(row, i) for i, row in enumerate(view.tasks.values())]
                sql, params = fold_params(run_id, token, (0, 0), end, rows, view)
                con.execute(sql, params)
        with self._flock:
            self.db.retrying(attempt, what=f"repairing run {run_id}", reset=self._reset_folder)

    def worker_folders(self, run_id: str) -> tuple[str, str]:
        """(the shared result directory, this run's folder in it): where workers keep
        durable files (step logs, budgets); every machine reaches it (see :mod:`.blobs`)."""
        return str(self.blobs.root), str(self.blobs.root / "runs" / run_id)

    def driver_alive(self, run_id: str) -> bool:
        """True if a driver holds an unexpired lease of ``run_id``."""
        return bool(self.get_run(run_id, tasks=False).driver_alive)

    def close(self) -> None:
        for run_id, mirror in list(self._mirrors.items()):
            self.release(Lease(run_id, mirror.token))
        self.keeper.close()
        with self._wlock:
            self._reset_writer()
        with self._flock:
            self._reset_folder()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
