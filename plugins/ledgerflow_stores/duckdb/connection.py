"""Opening the ledger file: the lock wait, the in-process lock, and error mapping.

DuckDB lets one process hold a file read-write, and then no other process
can open it at all, not even read-only. :class:`Ledger` opens the file only
for the moment it is needed, waits out another process's lock with
:func:`wait_for_lock` (the one retry helper), and serialises this process's
own connections to one file with a per-file lock.

"Opening" is an ``ATTACH`` to one in-memory DuckDB instance the process keeps
(:func:`instance`), and closing a ``DETACH``: the lock on the file is held
exactly as long as with a connection of its own, but starting a DuckDB
instance (its extensions, its catalog) costs ~20 ms and an attach ~1 ms.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ledgerflow import private
from ledgerflow.errors import DamagedLedgerError, NotALedgerError, StoreError, StoreLockedError

from . import schema
from .engine import duckdb
from .waiting import Waiting
from .writers import Writers

T = TypeVar("T")

_PROCESS_LOCKS: dict[str, threading.RLock] = {}
_PL_GUARD = threading.Lock()
_INSTANCE: tuple[int, Any] | None = None      # (pid, in-memory DuckDB)
_ALIASES = itertools.count(1)
#: The bytes of DuckDB's file headers (one main, two database headers): a new, empty
#: database file is exactly this long; a shorter one was cut while it was created.
HEADERS = 3 * 4096


#: A commit whose write-ahead log would pass this checkpoints at once instead, writing
#: no log (DuckDB skips the log of a commit estimated past 100 KB that checkpoints): a
#: fold's batch is written once, not to the log and then again at the detach
#: (a 10,000-task fold: 8 MB of log not written, ~15 ms less). A commit that adds a key
#: to a primary-keyed table (a run's first fold adds its ``runs`` and ``journal_folds``
#: rows) counts as past it too, so a small fold checkpoints at its commit (~11 ms for 10
#: tasks), which the detach would otherwise do.
CHECKPOINT_THRESHOLD = "256KB"


def instance() -> Any:
    """This process's in-memory DuckDB instance, that ledger files are attached to
    (one per process: a forked child starts its own)."""
    global _INSTANCE
    with _PL_GUARD:
        if _INSTANCE is None or _INSTANCE[0] != os.getpid():
            _INSTANCE = (os.getpid(), duckdb.connect(
                ":memory:", config={"checkpoint_threshold": CHECKPOINT_THRESHOLD}))
        return _INSTANCE[1]


#: (pid, setting) -> the value this process set on its instance (None: DuckDB's default)
_SETTINGS: dict[tuple[int, str], str | None] = {}


def instance_setting(con: Any, name: str, value: str | None) -> None:
    """Set (None: reset) one of the instance's global settings on ``con``, unless this
    process already did (a SET costs ~1 ms, a thread count change ~2 ms)."""
    key = (os.getpid(), name)
    if key in _SETTINGS and _SETTINGS[key] == value:
        return
    con.execute(f"RESET {name}" if value is None else f"SET {name} = {sql_string(value)}")
    _SETTINGS[key] = value


def cut_at_creation(head: bytes) -> bool:
    """True if ``head`` (a file's first :data:`HEADERS` bytes) is all there is of a DuckDB
    file cut while it was created: nothing, or part of its headers (``DUCK`` at byte 8)."""
    return len(head) < HEADERS and (not head or head[8:12] == b"DUCK")


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


class LedgerGoneError(StoreError):
    """The ledger file was removed after a run was written to it: a fold behind that
    run does not create it again (a temporary folder at the end of its block)."""


class Attached:
    """A ledger file attached to :func:`instance`, on a cursor of its own that uses it
    as its default database; :meth:`close` detaches it (a write is checkpointed
    then) and with that releases the file's lock."""

    __slots__ = ("alias", "cursor")

    def __init__(self, path: str, read_only: bool) -> None:
        cursor = instance().cursor()
        alias = f"ledger_{next(_ALIASES)}"
        try:
            cursor.execute(f"ATTACH {sql_string(path)} AS {alias}"
                           + (" (READ_ONLY)" if read_only else ""))
            cursor.execute(f"USE {alias}")
        except BaseException:
            cursor.close()
            raise
        self.alias = alias
        self.cursor: Any = cursor

    def execute(self, query: str, parameters: Any = None) -> Any:
        return self.cursor.execute(query, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)

    def close(self) -> None:
        """Detach the file (once: closing again does nothing)."""
        cursor = self.cursor
        if cursor is None:
            return
        self.cursor = None
        try:
            cursor.execute("USE memory")
            cursor.execute(f"DETACH {self.alias}")
        finally:
            cursor.close()


def process_lock(path: str) -> threading.RLock:
    """The lock this process holds while it has ``path`` open."""
    with _PL_GUARD:
        return _PROCESS_LOCKS.setdefault(path, threading.RLock())


_DAMAGE = ("corrupt", "checksum", "could not read", "truncated", "invalid block",
           "failed to read", "serialization", "not a valid duckdb")


def is_damage(exc: BaseException) -> bool:
    """True if a DuckDB error says the file itself is damaged (not a lock, not our SQL)."""
    msg = str(exc).lower()
    return isinstance(exc, (duckdb.IOException, duckdb.SerializationException,
                            duckdb.InternalException)) or any(w in msg for w in _DAMAGE)


#: The fix for a ledger file whose runs the journals beside it still hold.
REPAIR = "pipeline repair rebuilds the tables from the journals (keeps the old file)"


def journals_beside(location: str) -> bool:
    """True if the ledger's side folder holds a run's journal (the file was a ledger)."""
    try:
        return any(f.name.endswith((".jsonl", ".jsonl.gz"))
                   for f in Path(location + ".d", "journals").iterdir())
    except OSError:
        return False


def damaged(location: str, exc: BaseException) -> DamagedLedgerError:
    """The error for a ledger file DuckDB cannot read."""
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return DamagedLedgerError(f"ledger {location} is damaged: {first}")


def is_lock_error(exc: BaseException) -> bool:
    """True if ``exc`` says another process holds the file's lock."""
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


def wait_for_lock(attempt: Callable[[], T], *, timeout: float,
                  locked: Callable[[BaseException], bool] = is_lock_error,
                  what: str = "the ledger") -> T:
    """Call ``attempt`` until it does not fail with a lock error, for up to ``timeout`` s.

    Backs off from 5 ms to 100 ms. Raises StoreLockedError when time is up.
    """
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not locked(exc):
                raise
            if time.monotonic() >= deadline:
                raise StoreLockedError(f"{what} is locked by another process") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


class Ledger:
    """The DuckDB file of a store: short-lived connections with the schema checked."""

    def __init__(self, location: str, lock_timeout: float,
                 heal: Callable[[list[int]], None] | None = None, marked: bool = True) -> None:
        self.location = location
        self.lock_timeout = lock_timeout
        self.lock = process_lock(location)
        #: readers of other processes waiting for the file (folds yield to them)
        self.waiting = Waiting(Path(location + ".d") / "readers")
        #: this process's write connections, and the killed writers' markers (none for
        #: a file nothing reads until it is complete, e.g. a repair's new file)
        self.writers = Writers(Path(location + ".d") / "writers") if marked else None
        #: rebuilds a file a killed writer's torn checkpoint damaged (given the pids)
        self.heal = heal
        self._healing = False
        self.version: int | None = None     # known once checked
        #: threads in a :meth:`reading` block, and the read connection each keeps
        self._kept: dict[int, Any] = {}

    def held(self) -> bool:
        """True if this thread holds the file's process lock (a read block, a connection)."""
        lock: Any = self.lock     # (threading's RLock says so only to its Condition)
        return bool(lock._is_owned())

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Keep one read connection for every read of this thread in the block.

        A command that reads several things (a run, its approvals, its notices)
        then opens the file once, not once a read (an attach, a schema check and a
        detach each). A write in the block closes the kept connection first.
        """
        me = threading.get_ident()
        with self.lock:
            if me in self._kept:
                yield
                return
            self._kept[me] = None
            try:
                yield
            finally:
                con = self._kept.pop(me, None)
                if con is not None:
                    con.close()

    def exists(self) -> bool:
        """True if the file holds a database. A file cut while DuckDB created it (zero
        bytes, or part of DuckDB's headers: a kill at that moment) holds nothing and is
        a new ledger to complete, not damage; any other short file is someone else's."""
        try:
            if os.path.getsize(self.location) >= HEADERS:
                return True
            with open(self.location, "rb") as fh:
                return not cut_at_creation(fh.read(HEADERS))
        except OSError:
            return False

    def _complete_new(self) -> None:
        """Remove a file that :meth:`exists` does not count, so the write creates the
        ledger afresh; a file another process is creating (it holds the file's lock)
        is waited for like any lock."""
        try:
            fd = os.open(self.location, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise duckdb.IOException(
                    f"Could not set lock on file {self.location!r}: it is being created"
                ) from None
            if cut_at_creation(os.pread(fd, HEADERS, 0)):
                os.unlink(self.location)
        finally:
            os.close(fd)     # (and with it the lock)

    @contextlib.contextmanager
    def connect(self, write: bool, timeout: float | None = None, *,
                create: bool = True) -> Iterator[Any]:
        """A connection for one read or one fold; None when reading a missing file.

        ``create=False``: a write to a file that is not there raises
        :class:`LedgerGoneError` and creates nothing.
        """
        if write and not create and not self.exists():
            raise LedgerGoneError(f"ledger {self.location} is gone (removed since its run "
                                  "was written)", hint="nothing to do: its runs went with it")
        marking = self.writers.writing() if write and self.writers else contextlib.nullcontext()
        with self.lock, marking:
            me = threading.get_ident()
            kept = me in self._kept
            if kept and write and self._kept[me] is not None:
                self._kept[me].close()          # DuckDB: one mode per file and process
                self._kept[me] = None
            if not write and not self.exists():
                yield None
                return
            con = self._kept.get(me) if kept and not write else None
            if con is None:
                con = self._open_healing(write, self.lock_timeout if timeout is None
                                         else timeout)
                if kept and not write:
                    self._kept[me] = con
            try:
                # a file with no tables yet (killed while it was created) holds nothing
                yield None if not write and self.version == 0 else con
            except duckdb.Error as exc:
                if is_lock_error(exc) or not is_damage(exc):
                    raise
                raise damaged(self.location, exc) from None
            finally:
                if self._kept.get(me) is not con:
                    con.close()

    def _open_healing(self, write: bool, timeout: float) -> Any:
        """:meth:`_open_waiting`; a file a killed writer's checkpoint tore (see
        :mod:`.writers`) is rebuilt from the journals by :attr:`heal` and opened again.
        Other damage is refused, as bad input."""
        try:
            return self._open_waiting(write, timeout)
        except DamagedLedgerError:
            if self.heal is None or self.writers is None or self._healing:
                raise
            # no killed writer's marker: damage, unless another process rebuilt the file
            # since this open failed (it forgot the markers then): open it once more
            if not self.writers.killed() and not self.writers.ever_healed():
                raise
        with self.writers.healing():
            try:
                return self._open_waiting(write, timeout)    # another process healed it
            except DamagedLedgerError:
                killed = self.writers.killed()
                if not killed:
                    raise
            self._healing = True
            try:
                self.heal(killed)
            finally:
                self._healing = False
            self.writers.forget(killed)
        return self._open_waiting(write, timeout)

    def _open_waiting(self, write: bool, timeout: float) -> Any:
        """:meth:`_open`, waiting for a lock another process holds; a reader that
        waits says so (:mod:`.waiting`), and folds yield the file to it."""
        try:
            return self._open(write)
        except duckdb.Error as exc:
            if not is_lock_error(exc):
                raise
        marked = contextlib.nullcontext() if write else self.waiting.reader()
        with marked:
            return wait_for_lock(lambda: self._open(write), timeout=timeout,
                                 what=f"ledger {self.location}")

    def _open(self, write: bool) -> Any:
        try:
            created = False
            if write:
                private.make_dirs(Path(self.location).parent)
                if not self.exists():
                    self._complete_new()
                    created = True
                elif self.version is None:
                    # a damaged or foreign file must be refused before a write opens it
                    ro = Attached(self.location, read_only=True)
                    try:
                        schema.check(ro, self.location)
                    finally:
                        ro.close()
            con = Attached(self.location, read_only=not write)
            if created:     # DuckDB creates it with the umask's mode; nothing in it yet
                private.restrict(self.location)
        except duckdb.Error as exc:
            if is_lock_error(exc):
                raise
            msg = str(exc)
            if "Permission denied" in msg or "Read-only file system" in msg:
                raise StoreError(f"cannot open ledger {self.location}: permission denied",
                                 hint="make the folder writable, or pass --store PATH in a "
                                 "writable folder") from None
            if "not a valid DuckDB" in msg and os.path.getsize(self.location) == 0:
                raise damaged(self.location, exc) from None
            if "not a valid DuckDB" in msg and journals_beside(self.location):
                # overwritten: the journals beside it hold its runs (as pipeline doctor says)
                raise DamagedLedgerError(f"ledger {self.location} is damaged: not a DuckDB "
                                         "file any more, but the journals beside it hold "
                                         "its runs", hint=REPAIR) from None
            if "not a valid DuckDB" in msg:
                raise NotALedgerError(f"{self.location} is not a ledgerflow ledger "
                                      "(not a DuckDB file)", hint=schema.NOT_A_LEDGER) from None
            if is_damage(exc):
                raise damaged(self.location, exc) from None
            raise StoreError(f"cannot open ledger {self.location}: {msg}",
                             hint="check the path and its permissions") from None
        try:
            self.version = self._migrate(con) if write else schema.check(con, self.location)
            if not write and 0 < self.version < schema.SCHEMA_VERSION:
                # written by an older ledgerflow: readers query the newer tables, so
                # the file is brought up to date once (a write), then read
                con.close()
                self._open(write=True).close()
                con = Attached(self.location, read_only=True)
                self.version = schema.check(con, self.location)
        except duckdb.Error as exc:
            con.close()
            if is_lock_error(exc) or not is_damage(exc):
                raise
            raise damaged(self.location, exc) from None
        except BaseException:
            con.close()
            raise
        return con

    def _migrate(self, con: Any) -> int:
        """:func:`.schema.migrate`; a migration the tables refuse (a schema version
        older than the tables, e.g. set back by hand or by an old copy of ``meta``) is
        damage that ``pipeline repair`` rebuilds, not an internal error."""
        try:
            return schema.migrate(con, self.location)
        except duckdb.Error as exc:
            if is_lock_error(exc) or is_damage(exc):
                raise
            first = str(exc).strip().splitlines()[0][:200]
            raise DamagedLedgerError(
                f"ledger {self.location} is damaged: its schema version is older than its "
                f"tables (the migration failed: {first})") from None

    def transaction(self, con: Any) -> contextlib.AbstractContextManager[None]:
        """``BEGIN``/``COMMIT`` around a block, ``ROLLBACK`` if it raises."""
        return _transaction(con)


@contextlib.contextmanager
def _transaction(con: Any) -> Iterator[None]:
    con.execute("BEGIN")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
