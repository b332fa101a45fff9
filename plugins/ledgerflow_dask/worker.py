"""The worker side of the ``dask`` executor: run one attempt, return it encoded.

This module is imported by reference in every Dask worker process, so the
workers need ``ledgerflow`` (with this plugin) installed. Jobs travel as
cloudpickle bytes made by the driver; the attempt runs through
:func:`ledgerflow.executor.execute` with ``keep_value=False`` and the
:class:`~ledgerflow.executor.Completion` goes back as pickle bytes, so a
value or an exception that cannot be serialised never fails the Dask task.

Cancellation is a per-process set of Dask keys that the driver fills with
``Client.run(mark_cancelled, keys)``; ``context().cancel_requested`` reads
it, which costs a set lookup and no network round trip.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
import traceback
from typing import Any

import cloudpickle

from ledgerflow.errors import NonRetryableError
from ledgerflow.executor import Completion, execute

_CANCELLED: dict[str, float] = {}
_LOCK = threading.Lock()
_KEEP_MARKS = 3600.0     # forget cancel marks of jobs that never arrived after an hour


def mark_cancelled(keys: list[str]) -> int:
    """Mark Dask keys as cancelled in this worker process (run through ``Client.run``)."""
    now = time.time()
    with _LOCK:
        for key in keys:
            _CANCELLED[key] = now
        if len(_CANCELLED) > 10_000:
            for k, t in list(_CANCELLED.items()):
                if now - t > _KEEP_MARKS:
                    del _CANCELLED[k]
    return len(keys)


def is_cancelled(key: str) -> bool:
    """True once the driver asked to stop the job with this Dask key."""
    return key in _CANCELLED


def run_job(payload: bytes, job_id: int, key: str, topic: str | None = None) -> bytes:
    """Run the pickled job; return its pickled Completion (never raises).

    With ``topic`` set, announce the start first, so the driver notices when
    a scheduler silently runs the job again after its worker died.
    """
    started = time.time()
    if topic:
        with contextlib.suppress(Exception):
            from distributed import get_worker
            get_worker().log_event(topic, (job_id, started))
    if key in _CANCELLED:           # cancelled or abandoned before it started
        return _dump(Completion(job_id, "cancelled", started_at=started, ended_at=started,
                                has_value=False))
    try:
        job = cloudpickle.loads(payload)
    except BaseException as exc:    # e.g. a module the worker cannot import (or that exits)
        return _dump(Completion(
            job_id, "error", error=exc, error_type=type(exc).__name__,
            error_message=f"the worker could not load the task: {exc}"[:2000],
            traceback="".join(traceback.format_exception(exc))[-8000:],
            started_at=started, ended_at=time.time(), has_value=False))
    try:
        completion = execute(job, lambda: key in _CANCELLED, keep_value=False)
    finally:
        with _LOCK:
            _CANCELLED.pop(key, None)
    return _dump(completion)


def _dump(c: Completion) -> bytes:
    if c.error is not None:
        try:    # the driver must be able to load it too (keyword-only __init__s fail)
            pickle.loads(cloudpickle.dumps(c.error, protocol=5))
        except Exception:
            c.error = _portable(c.error)
    try:
        return cloudpickle.dumps(c, protocol=5)
    except Exception:
        c.error = _portable(c.error)
        return cloudpickle.dumps(c, protocol=5)


def _portable(exc: BaseException | None) -> BaseException | None:
    """A picklable stand-in for an exception that is not (keeps retryability)."""
    if exc is None:
        return None
    kind = NonRetryableError if isinstance(exc, NonRetryableError) else RuntimeError
    return kind(f"{type(exc).__name__}: {exc}"[:2000])


def load_completion(data: Any) -> Completion:
    """Turn what :func:`run_job` returned back into a Completion (driver side)."""
    c = pickle.loads(data)
    assert isinstance(c, Completion)
    return c
