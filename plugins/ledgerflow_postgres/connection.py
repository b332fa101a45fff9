"""Talking to the database: connecting, masking URLs, waiting out an outage, the store's connections.

:class:`Database` owns the URL and the bound on waiting; :class:`Connections`
the store's three kinds of connection (one writer, one folder, a reader pool). Every operation of
the store goes through :meth:`Database.retrying`: a connection error (the
server stopped, restarted, or is still recovering) closes the connection,
says so once on the ``ledgerflow`` logger, and tries again with backoff
(50 ms doubling to 1 s) until the server is back or ``wait`` seconds have
passed, then raises :class:`StoreUnavailableError`. Errors that waiting
cannot fix (a wrong password, a database that does not exist) are raised at
once as :class:`~ledgerflow.errors.StoreError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ledgerflow.errors import LeaseLostError, StoreError

from . import schema

log = logging.getLogger("ledgerflow")
T = TypeVar("T")

#: Seconds an operation waits for the database to come back (LEDGERFLOW_STORE_WAIT):
#: minutes, so a restart of the server (crash recovery included) is waited out.
DEFAULT_WAIT = 180.0
#: Seconds between the "still waiting" messages of an outage.
PROGRESS_EVERY = 15.0


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name``."""
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


class StoreUnavailableError(StoreError):
    """The database did not answer within the configured wait."""

    exit_code = 1


def mask(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    return re.sub(r"(://[^:/@]+:)[^@/]*@", r"\1***@", url)


def _transient(exc: BaseException) -> bool:
    """True for errors that may go away when the server is back."""
    import psycopg
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None) or ""
    # authentication (28...) and a missing database (3D000) do not heal by waiting;
    # a failed connect carries no SQLSTATE, only the server's message
    if state.startswith("28") or state == "3D000":
        return False
    text = str(exc)
    return not any(m in text for m in _PERMANENT)


#: What the server says when connecting cannot work however long one waits.
_PERMANENT = ("does not exist", "password authentication failed", "no pg_hba.conf entry",
              "authentication failed", "invalid port", "invalid connection option",
              "missing \"=\"", "invalid URI")


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` is a lost or refused connection (waiting may help)."""
    return _transient(exc)


class Database:
    """One PostgreSQL database: its URL, how to connect, how long to wait for it."""

    def __init__(self, url: str, *, wait: float = DEFAULT_WAIT) -> None:
        self.url = url
        self.wait = wait
        self.shown = mask(url)
        self._outage_lock = threading.Lock()
        self.progress_every = PROGRESS_EVERY

    def connect(self, *, timeout: float | None = None) -> Any:
        """A new autocommit connection (raises psycopg errors)."""
        import psycopg
        t = max(1, int(min(self.wait, 5.0) if timeout is None else timeout))
        return psycopg.connect(self.url, autocommit=True, connect_timeout=t,
                               application_name="ledgerflow")

    def retrying(self, attempt: Callable[[bool], T], *, what: str,
                 reset: Callable[[], None] = lambda: None,
                 fenced: Callable[[], str | None] | None = None,
                 hint: str | None = None, wait: float | None = None) -> T:
        """Call ``attempt(retry)`` until it does not fail with a connection error.

        ``retry`` is True from the second call on (the caller checks what
        landed before sending again). ``reset`` drops the broken connection;
        ``fenced`` says why this driver must stop (then LeaseLostError).

        Raises:
            StoreUnavailableError: the database stayed away for ``wait`` seconds.
            StoreError: an error that waiting cannot fix.
        """
        bound = self.wait if wait is None else wait
        started: float | None = None
        told = 0.0
        delay = 0.05
        retry = False
        while True:
            try:
                result = attempt(retry)
            except Exception as exc:
                if not _transient(exc):
                    if _is_connect_refusal(exc):
                        raise StoreError(f"cannot use the database {self.shown}: "
                                         f"{_first_line(exc)}",
                                         hint="check the URL's user and database, and the "
                                         "password in PGPASSWORD or ~/.pgpass") from exc
                    raise
                reset()
                now = time.monotonic()
                if started is None:
                    started = told = now
                    log.warning("ledgerflow: database %s unreachable while %s (%s); "
                                "waiting up to %gs for it (LEDGERFLOW_STORE_WAIT)",
                                self.shown, what, _first_line(exc), bound)
                if fenced is not None:
                    reason = fenced()
                    if reason is not None:
                        raise LeaseLostError(f"lease lost: {reason}") from exc
                if now - told >= self.progress_every and now - started < bound:
                    told = now
                    log.warning("ledgerflow: still waiting for database %s (%.0fs of %gs)",
                                self.shown, now - started, bound)
                if now - started >= bound:
                    raise StoreUnavailableError(
                        f"store unavailable: database {self.shown} did not answer for "
                        f"{now - started:.0f}s while {what} ({_first_line(exc)})",
                        hint=hint or "start the database (or raise LEDGERFLOW_STORE_WAIT), "
                        "then run the command again") from exc
                time.sleep(min(delay, max(0.0, started + bound - now)))
                delay = min(delay * 2, 1.0)
                retry = True
                continue
            if started is not None:
                log.warning("ledgerflow: database %s is back after %.1fs", self.shown,
                            time.monotonic() - started)
            return result


def _is_connect_refusal(exc: BaseException) -> bool:
    import psycopg
    return isinstance(exc, psycopg.OperationalError)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def snapshot(con: Any) -> Iterator[None]:
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


def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):    # a broken connection is gone anyway
            conn.close()


class Connections:
    """A store's connections: the writer (commits, leases; under ``wlock``), the folder
    (folds, repairs; under ``flock``, one fold at a time) and a pool of readers. The
    first connection migrates the schema."""

    def __init__(self, db: Database, url: str) -> None:
        self.db = db
        self.url = url
        self.wlock = threading.RLock()      # the writer connection and the store's mirrors
        self.flock = threading.RLock()      # the fold connection; one fold at a time
        self.wconn: Any = None
        self.fconn: Any = None
        self._pool: Any = None
        self._pool_lock = threading.Lock()
        self.migrated = False

    def _prepare(self, con: Any) -> None:
        if not self.migrated:
            schema.migrate(con, self.db.shown)
            self.migrated = True

    def writer(self) -> Any:
        """The writer connection (connected again if it broke)."""
        if self.wconn is None or self.wconn.closed:
            self.wconn = self.db.connect()
            self._prepare(self.wconn)
        return self.wconn

    def reset_writer(self) -> None:
        conn, self.wconn = self.wconn, None
        _close(conn)

    def folder(self) -> Any:
        """The fold connection (connected again if it broke)."""
        if self.fconn is None or self.fconn.closed:
            self.fconn = self.db.connect()
            self._prepare(self.fconn)
        return self.fconn

    def reset_folder(self) -> None:
        conn, self.fconn = self.fconn, None
        _close(conn)

    def readers(self) -> Any:
        """The reader pool (opened on first use)."""
        with self._pool_lock:
            if self._pool is None:
                from psycopg_pool import ConnectionPool
                self._pool = ConnectionPool(
                    self.url, min_size=0, max_size=4, open=True,
                    check=ConnectionPool.check_connection, name="ledgerflow-readers",
                    kwargs={"autocommit": True, "application_name": "ledgerflow",
                            "connect_timeout": max(1, int(min(self.db.wait, 5)))})
            return self._pool

    def read(self, fn: Callable[[Any], T], what: str, *, in_snapshot: bool = True) -> T:
        """``fn(con)`` on a pooled connection, in one read-only snapshot (a REPEATABLE
        READ transaction) unless ``in_snapshot=False`` (small writes in autocommit)."""
        from psycopg_pool import PoolTimeout

        def attempt(retry: bool) -> T:
            if not self.migrated:
                with self.wlock:
                    self.writer()       # the first use connects directly: real errors
            try:
                with self.readers().connection(
                        timeout=max(1.0, min(self.db.wait, 5.0))) as con:
                    if not in_snapshot:
                        return fn(con)
                    with snapshot(con):
                        return fn(con)
            except PoolTimeout:
                # the pool only says it got no connection: a direct one says why
                self.db.connect(timeout=2).close()
                raise
        return self.db.retrying(attempt, what=what)

    def close(self) -> None:
        """Close the writer, the folder and the pool."""
        with self.wlock:
            self.reset_writer()
        with self.flock:
            self.reset_folder()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
