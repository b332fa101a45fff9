"""Sharing one open index file among the threads of a process, and retrying its locks.

DuckDB allows one process at a time to open a file read-write, and two
threads of one process racing to open (or close) the same file can see a
half-initialised database. So, per index file and per process, the file is
open at most once (a *handle*); threads that need the index at the same time
share it through their own cursors, and the last one out closes it. Between
processes, a file lock (``INDEX.lock``, filelock) queues the openers instead
of letting them spin on DuckDB's lock error. A handle admits new users only
for ``HOLD_SECONDS`` after it was opened; then it is closed as soon as its
users finish, so that waiting processes get their turn.

"Open" is an ``ATTACH`` of the file to one in-memory DuckDB database that the
process keeps, and "close" a ``DETACH``: that releases the file to other
processes just as closing a connection does, for about 1 ms instead of the
~15-25 ms of starting and stopping a DuckDB database per piece of work (a run
writes the index once per document).

All of this state belongs to one process: it is looked up by process id, so a
child forked at any moment (a lock held by another thread, an index attached)
starts with state of its own instead of inheriting locked locks and handles.

Every operation runs one short transaction (:func:`transaction`); conflicting
transactions and lock errors are retried with jittered exponential backoff for
``LEDGERFLOW_INDEX_LOCK_TIMEOUT`` seconds in all (default 60).

Why not the ledger's ``is_lock_error``/``wait_for_lock``
(``ledgerflow_stores.duckdb.connection``): the index is a many-process write
queue, not one driver's file. It also retries transaction conflicts and
DuckDB's in-process ``ResourceInUseException``, needs jitter so that many
worker processes do not retry in step, and says ``IndexLockedError`` with the
index's own setting as the hint; and one plugin does not import another.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb

from .errors import IndexLockedError, IndexMismatchError, IndexNotFoundError
from .locks import file_lock, lock_timeout

if TYPE_CHECKING:
    from filelock import BaseFileLock

T = TypeVar("T")

__all__ = ["HOLD_SECONDS", "connect", "is_conflict", "is_lock_error", "retry", "transaction"]

#: How long a process may keep admitting new users to an open index.
HOLD_SECONDS = 0.25


def is_lock_error(exc: BaseException) -> bool:
    """True if ``exc`` says the file is open elsewhere (another process, or this one)."""
    text = str(exc).lower()
    if type(exc).__name__ == "ResourceInUseException":   # open elsewhere in this process
        return True
    return isinstance(exc, duckdb.IOException) and ("lock" in text or "resource" in text)


def is_conflict(exc: BaseException) -> bool:
    """True if ``exc`` is a conflict of concurrent transactions (retrying may succeed)."""
    if isinstance(exc, duckdb.TransactionException):
        return True
    text = str(exc).lower()
    return isinstance(exc, duckdb.ConstraintException) and "duplicate key" in text


@dataclass(slots=True)
class _Handle:
    """This process's attachment of one index file (see the notes above)."""

    path: str
    alias: str = ""
    users: int = 1
    con: duckdb.DuckDBPyConnection | None = None   # the in-memory root; cursors USE alias
    lock: BaseFileLock | None = None
    opened: float = 0.0


@dataclass(slots=True)
class _Process:
    """The handles of one process, their condition, and its in-memory DuckDB database."""

    pid: int
    handles: dict[str, _Handle] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    root_lock: threading.Lock = field(default_factory=threading.Lock)  # uses of root
    root: duckdb.DuckDBPyConnection | None = None


_state = _Process(os.getpid())
#: The parent's state in a forked child: kept, never used, never freed (freeing its
#: DuckDB database would stop threads that do not exist in the child).
_inherited: list[_Process] = []


def _here() -> _Process:
    """This process's state (new in a child that was forked from another process)."""
    global _state
    state = _state
    if state.pid != os.getpid():
        _inherited.append(state)
        state = _state = _Process(os.getpid())
    return state


def _attach(path: str, alias: str) -> duckdb.DuckDBPyConnection:
    state = _here()
    quoted = path.replace("'", "''")
    with state.root_lock:
        if state.root is None:
            state.root = duckdb.connect(":memory:")
        state.root.execute(f"ATTACH '{quoted}' AS {alias}")
        return state.root


def _detach(root: duckdb.DuckDBPyConnection, alias: str) -> None:
    with _here().root_lock:
        root.execute(f"DETACH {alias}")


def _acquire(path: str, deadline: float) -> _Handle:
    """Join this process's open handle of ``path``, or open one."""
    pause = 0.0
    state = _here()
    with state.cond:
        while True:
            handle = state.handles.get(path)
            if handle is None:
                handle = state.handles[path] = _Handle(path)
                break
            if handle.con is not None and time.monotonic() - handle.opened < HOLD_SECONDS:
                handle.users += 1
                return handle
            if handle.con is not None:
                pause = 0.02  # it expired: let other processes in before reopening
            if time.monotonic() > deadline:
                raise IndexLockedError(f"could not open {path}: timed out waiting for "
                                       "other threads of this process")
            state.cond.wait(timeout=0.05)
    try:
        if pause:
            time.sleep(pause * random.random())
        handle.lock = file_lock(path + ".lock", deadline)
        handle.alias = "index_" + hashlib.sha256(path.encode()).hexdigest()[:16]
        try:
            handle.con = retry(lambda: _attach(path, handle.alias),
                                deadline - time.monotonic(), f"open {path}", lock_only=True)
        except duckdb.Error as exc:
            handle.lock.release()
            raise IndexMismatchError(f"cannot open {path} as an index: {exc}",
                                     hint="pass the path of a doc_index index, or a new "
                                          "path") from exc
        except BaseException:
            handle.lock.release()
            raise
    except BaseException:
        with state.cond:
            del state.handles[path]
            state.cond.notify_all()
        raise
    with state.cond:
        handle.opened = time.monotonic()
        state.cond.notify_all()
    return handle


def _release(handle: _Handle) -> None:
    """Leave the handle; the last user closes the file and releases the lock."""
    state = _here()
    with state.cond:
        handle.users -= 1
        if handle.users:
            return
        try:
            if handle.con is not None:
                _detach(handle.con, handle.alias)
        finally:
            if handle.lock is not None:
                handle.lock.release()
            del state.handles[handle.path]
            state.cond.notify_all()


@contextmanager
def connect(index: str | os.PathLike[str], *, create: bool = True,
            timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the index file for a short piece of work (see the notes above).

    Waits (with backoff) while another process has the file open. The
    connection is a cursor of this process's shared handle: do not keep it.

    Raises:
        IndexNotFoundError: ``create=False`` and the file does not exist.
        IndexLockedError: still busy after ``timeout`` seconds
            (default ``LEDGERFLOW_INDEX_LOCK_TIMEOUT``, 60).
    """
    path = Path(index)
    if not create and not path.exists():
        raise IndexNotFoundError(
            f"index {str(index)!r} does not exist",
            hint=f"build it first, e.g. pipeline run recipes/doc_index/pipeline.py "
                 f"-p source=DOCS -p index={index}")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (lock_timeout() if timeout is None else timeout)
    handle = _acquire(str(path.resolve()), deadline)
    try:
        assert handle.con is not None
        with _here().root_lock:
            cursor = handle.con.cursor()
        try:
            cursor.execute(f"USE {handle.alias}")
            yield cursor
        finally:
            cursor.close()
    finally:
        _release(handle)


def retry(fn: Callable[[], T], timeout: float | None, what: str, *,
          lock_only: bool = False) -> T:
    """Call ``fn``, retrying lock errors (and conflicts unless ``lock_only``) with backoff."""
    deadline = time.monotonic() + (lock_timeout() if timeout is None else timeout)
    delay = 0.005
    while True:
        try:
            return fn()
        except duckdb.Error as exc:
            retryable = is_lock_error(exc) or (not lock_only and is_conflict(exc))
            if not retryable:
                raise
            if time.monotonic() + delay > deadline:
                raise IndexLockedError(
                    f"could not {what}: still locked or conflicting after retrying "
                    f"({exc}); another process may hold the index open") from exc
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)


def transaction(index: str | os.PathLike[str], fn: Callable[[duckdb.DuckDBPyConnection], T],
                *, create: bool = True, timeout: float | None = None) -> T:
    """Run ``fn(con)`` in one transaction on a fresh connection; retry locks and conflicts."""
    def attempt() -> T:
        with connect(index, create=create, timeout=timeout) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                result = fn(con)
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass  # a failed COMMIT already ended the transaction
                raise
            return result

    return retry(attempt, timeout, f"write {index}")

