"""The index's file locks between processes, and how long to wait for them.

``INDEX.lock`` queues the processes that open the index file (see
:mod:`.handle`); ``INDEX.embed.lock`` serialises the look-up / embed / store
step of the embedding cache (see :mod:`.embedcache`). Both wait at most
``LEDGERFLOW_INDEX_LOCK_TIMEOUT`` seconds (default 60). Nothing of DuckDB here.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from .errors import IndexLockedError

if TYPE_CHECKING:
    from filelock import BaseFileLock

__all__ = ["file_lock", "lock_timeout"]


def lock_timeout() -> float:
    """Seconds to wait for the index in all (``LEDGERFLOW_INDEX_LOCK_TIMEOUT``, default 60)."""
    return float(os.environ.get("LEDGERFLOW_INDEX_LOCK_TIMEOUT", "60"))


def file_lock(path: str, deadline: float, what: str = "the index") -> BaseFileLock:
    """Take the file lock ``path`` (waiting until ``deadline``, a monotonic time).

    Not tied to a thread: the thread that releases it may differ from the
    one that took it (the last user of a shared handle closes it).

    Raises:
        IndexLockedError: another process held it until the deadline.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=max(0.0, deadline - time.monotonic()), poll_interval=0.005)
    except Timeout:
        raise IndexLockedError(
            f"could not lock {path}: another process kept {what} busy for "
            f"{lock_timeout():.0f}s (LEDGERFLOW_INDEX_LOCK_TIMEOUT)") from None
    return lock
