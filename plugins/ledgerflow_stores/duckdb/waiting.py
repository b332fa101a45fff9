"""Readers waiting for the ledger's file: the markers a folding writer yields to.

DuckDB's file lock has no queue: a reader polling for it can miss every short
window a busy writer leaves (on a loaded machine a 100 ms sleep often lasts
seconds), and ``status`` failed after 30 s (issue 34 #1). A reader that finds
the file locked leaves a marker in ``PATH.d/readers`` until it gets in; a fold
that may yield (the background fold, the fold at release, ``pipeline fold``)
ends its bite after the batch in progress and keeps off the file while a marker
is there. A marker older than :data:`STALE` seconds (a killed reader) is ignored.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ledgerflow import private

#: Seconds after which a reader's marker no longer counts (a reader waits 30 s at most).
STALE = 60.0


class Waiting:
    """The readers waiting for one ledger file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @contextlib.contextmanager
    def reader(self) -> Iterator[None]:
        """Mark this thread as waiting for the file for the block."""
        path = self.folder / f"{os.getpid()}-{threading.get_ident()}"
        try:
            private.make_dirs(self.folder)
            os.close(private.open_file(path, os.O_WRONLY | os.O_CREAT))
        except OSError:          # a folder this reader cannot write: it polls unmarked
            yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.unlink()

    def any(self) -> bool:
        """True if a reader waits for the file now."""
        try:
            entries = os.scandir(self.folder)
        except OSError:
            return False
        now = time.time()
        with entries:
            for entry in entries:
                try:
                    if now - entry.stat().st_mtime < STALE:
                        return True
                except OSError:
                    continue
        return False

    def wait_gone(self, timeout: float) -> None:
        """Wait until no reader waits, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.any() and time.monotonic() < deadline:
            time.sleep(0.05)
