"""Garbage-collector tuning around tracing and driving (see :func:`quiet_gc`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the cyclic GC from rescanning the whole heap while a run is built or driven.

    Tracing a pipeline and driving a run allocate a few long-lived objects
    per task; with the default thresholds the collector walks every older
    object again and again (a third of the time of a 10,000-task inline run).
    Objects that existed before are frozen (``gc.freeze``) and young
    collections run less often; both are undone when the block ends. Cyclic
    garbage made inside the block is still collected.
    """
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(old[0], 20_000), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
