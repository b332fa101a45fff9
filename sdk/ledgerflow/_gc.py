"""Garbage-collector tuning around tracing and driving (see :func:`quiet_gc`)."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] = (0, 0, 0)
_freezing = False


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the cyclic GC from rescanning the whole heap while a run is built or driven.

    Tracing a pipeline and driving a run allocate a few long-lived objects
    per task; with the default thresholds the collector walks every older
    object again and again (a third of the time of a 10,000-task inline run).
    Objects that existed before are frozen (``gc.freeze``) and young
    collections run less often; both are undone when the last such block
    ends (blocks nest and overlap across threads: runs driven in the
    background). Cyclic garbage made meanwhile is still collected. A program
    that froze objects itself (``gc.freeze()`` before forking) keeps them
    frozen: then only the threshold is changed.
    """
    global _depth, _saved, _freezing
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(max(_saved[0], 20_000), _saved[1], _saved[2])
            _freezing = gc.get_freeze_count() == 0
        _depth += 1
        if _freezing:
            gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                if _freezing:
                    gc.unfreeze()
