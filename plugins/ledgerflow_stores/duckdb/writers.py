"""Writers of the ledger's file: markers that tell a killed writer's torn checkpoint.

DuckDB rewrites a metadata block of the file in place at every checkpoint
(block 0, that holds the catalog, among them), and a ``kill -9`` that lands
inside that ``pwrite`` cuts it: Linux stops a buffered write between pages
when a fatal signal is pending. The file's header still points into the
block, whose checksum no longer matches, so DuckDB refuses the whole file.
Nothing committed is lost (the journals hold every run), but the file must be
rebuilt from them.

To tell that damage, which ledgerflow's own killed process made, from damage
the file suffered otherwise (bad input: refused with the fix), every write
connection holds a marker ``PATH.d/writers/PID`` with an ``fcntl`` lock on it
from before the attach until after the detach (its checkpoint). A marker whose
lock nobody holds was left by a writer killed while it had the file open.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ledgerflow import private


class Writers:
    """The write markers of one ledger file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._depth = 0         # nested write connections of this process

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold this process's marker for the block (one open of the file for writing)."""
        mine = self.folder / str(os.getpid())
        fd = -1
        if not self._depth:
            try:
                try:
                    fd = private.open_file(mine, os.O_RDWR | os.O_CREAT)
                except FileNotFoundError:
                    private.make_dirs(self.folder)
                    fd = private.open_file(mine, os.O_RDWR | os.O_CREAT)
                fcntl.lockf(fd, fcntl.LOCK_EX)
            except OSError:      # a folder this process cannot write: it writes unmarked
                if fd >= 0:
                    os.close(fd)
                fd = -1
        self._depth += 1
        clean = False
        try:
            yield
            clean = True
        finally:
            self._depth -= 1
            if fd >= 0:
                with contextlib.suppress(OSError):
                    mine.unlink()
                os.close(fd)        # (and with it the lock)
            if clean and not self._depth:
                # this process opened, wrote and checkpointed the file: what a killed
                # writer left before did not tear it
                self.forget(self.killed())

    @contextlib.contextmanager
    def healing(self) -> Iterator[None]:
        """Hold the file's heal lock for the block: one process rebuilds a torn file,
        the others wait and then find it whole."""
        private.make_dirs(self.folder)
        fd = private.open_file(self.folder / "heal.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def ever_healed(self) -> bool:
        """True if a process took the heal lock of this file (made with the first heal)."""
        return (self.folder / "heal.lock").exists()

    def forget(self, pids: list[int]) -> None:
        """Remove the markers of killed writers ``pids`` (the file was found whole, or
        rebuilt)."""
        for pid in pids:
            with contextlib.suppress(OSError):
                (self.folder / str(pid)).unlink()

    def killed(self) -> list[int]:
        """The processes killed while they had the file open for writing (their marker
        is there, its lock is not held)."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        found = []
        for name in names:
            if not name.isdigit() or int(name) == os.getpid():
                continue        # (testing our own marker's lock would drop it)
            try:
                fd = os.open(self.folder / name, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue        # held: that writer is alive
            finally:
                os.close(fd)
            found.append(int(name))
        return sorted(found)
