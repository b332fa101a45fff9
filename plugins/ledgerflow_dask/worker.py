"""The worker side of the ``dask`` executor: run one attempt, return it compactly.

This module is imported by reference in every Dask worker process, so the
workers need ``ledgerflow`` (with this plugin) installed.

What travels is split in two (see :mod:`ledgerflow_dask.wire` for the driver's
half): the *spec* of a task (its function and what every attempt of it in a
run shares, as cloudpickle bytes) is scattered to the workers once and kept
decoded in a per-process cache keyed by its id; each job carries only that
id, its job id, task key, attempt, arguments and the rare extras. The attempt
runs through :func:`ledgerflow.executor.execute` with ``keep_value=False``; a
plain success is answered as ``(started, ended, data)`` (``kind`` too unless
JSON), anything else as the pickled
:class:`~ledgerflow.executor.Completion`, so a value or an exception that
cannot be serialised never fails the Dask task. The answer is the Dask
task's result and, up to ``_PUSH_BYTES``, also pushed to the driver as an
event (worker -> scheduler -> client on the streams Dask keeps open), so the
driver needs no ``gather`` round trip per batch of results.

Cancellation is a per-process set of Dask keys that the driver fills with
``Client.run(mark_cancelled, keys)``; ``context().cancel_requested`` reads
it, which costs a set lookup and no network round trip. A job announces its
start (``Worker.log_event``) when the driver asked for it: jobs with a
timeout (counted from that start) and every job on a scheduler that re-runs
tasks of dead workers.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import cloudpickle

from ledgerflow.errors import NonRetryableError
from ledgerflow.executor import Completion, Job, execute

_CANCELLED: dict[str, float] = {}
_LOCK = threading.Lock()
_KEEP_MARKS = 3600.0     # forget cancel marks of jobs that never arrived after an hour
#: Task specs of this process by id, as registered (bytes) or once decoded (least
#: recently used first).
_SPECS: OrderedDict[str, bytes | tuple[Job, str | None, str]] = OrderedDict()
_KEEP_SPECS = 512
#: What a job answers when its spec is not in this process (the driver sends it again).
MISSING = "ledgerflow-dask: task spec not on this worker"
#: Answers up to this size are pushed to the driver with the start/result events.
_PUSH_BYTES = 8 << 10     # (the scheduler keeps a topic's last 1,000 events)


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


def register_spec(spec_id: str, data: bytes) -> None:
    """Keep a task spec in this worker process (run through ``Client.run``)."""
    with _LOCK:
        _SPECS[spec_id] = data
        while len(_SPECS) > _KEEP_SPECS:
            _SPECS.popitem(last=False)


def forget_specs(ids: list[str]) -> None:
    """Drop task specs of a finished drive (run through ``Client.run``)."""
    with _LOCK:
        for spec_id in ids:
            _SPECS.pop(spec_id, None)


def _spec(spec: str | tuple[str, bytes]) -> tuple[Job, str | None, str] | None:
    """``(template job, topic, key prefix)`` of a spec id (or of ``(id, bytes)``, which
    registers it first), decoded at its first use; None if this process lacks it."""
    if type(spec) is tuple:
        register_spec(*spec)
        spec = spec[0]
    with _LOCK:
        hit = _SPECS.get(spec)
        if hit is None:
            return None
        _SPECS.move_to_end(spec)
    if type(hit) is not bytes:
        return hit
    decoded = cloudpickle.loads(hit)
    assert isinstance(decoded[0], Job)
    with _LOCK:
        _SPECS[spec] = decoded
    return decoded


def run_job(spec: str | tuple[str, bytes], job_id: int, task_key: str, attempt: int, args: Any, kwargs: Any,
            announce: bool = False, extras: dict[str, Any] | None = None) -> Any:
    """Run one attempt of the task ``spec``; return it compactly (never raises).

    ``args``/``kwargs`` are the values themselves, or cloudpickle bytes of
    ``(args, kwargs)`` in ``args`` (``kwargs`` None). The answer is also
    pushed to the spec's topic as ``("r", job_id, answer)``, and with
    ``announce`` the start first, as ``("s", job_id, wall time)``.
    """
    started = time.time()
    try:
        decoded = _spec(spec)
    except BaseException as exc:    # e.g. a module the worker cannot import (or that exits)
        return _unloadable(job_id, exc, started)
    if decoded is None:
        return MISSING
    template, topic, prefix = decoded
    if topic and announce:
        _event(topic, ("s", job_id, started))
    answer = _run(template, f"{prefix}{job_id}", job_id, task_key, attempt, args, kwargs,
                  extras, started)
    if topic and len(answer[2] if type(answer) is tuple else answer) <= _PUSH_BYTES:
        _event(topic, ("r", job_id, answer))
    return answer


def _event(topic: str, msg: tuple[Any, ...]) -> None:
    with contextlib.suppress(Exception):    # the Dask result is there all the same
        from distributed import get_worker
        get_worker().log_event(topic, msg)


def _unloadable(job_id: int, exc: BaseException, started: float) -> bytes:
    return _dump(Completion(
        job_id, "error", error=exc, error_type=type(exc).__name__,
        error_message=f"the worker could not load the task: {exc}"[:2000],
        traceback="".join(traceback.format_exception(exc))[-8000:],
        started_at=started, ended_at=time.time(), has_value=False))


def _run(template: Job, key: str, job_id: int, task_key: str, attempt: int, args: Any,
         kwargs: Any, extras: dict[str, Any] | None, started: float) -> Any:
    if key in _CANCELLED:           # cancelled or abandoned before it started
        return _dump(Completion(job_id, "cancelled", started_at=started, ended_at=started,
                                has_value=False))
    if kwargs is None:
        try:
            args, kwargs = cloudpickle.loads(args)
        except BaseException as exc:
            return _unloadable(job_id, exc, started)
    job = replace(template, id=job_id, task_key=task_key, attempt=attempt, args=tuple(args),
                  kwargs=kwargs, **(extras or {}))
    try:
        c = execute(job, lambda: key in _CANCELLED, keep_value=False)
    finally:
        with _LOCK:
            _CANCELLED.pop(key, None)
    enc = c.encoded
    if c.outcome == "ok" and enc is not None and not (
            c.log or c.lineage or c.steps or c.model_calls or c.tool_calls or c.notices):
        if enc.kind == "json":
            return (c.started_at, c.ended_at, enc.data)
        return (c.started_at, c.ended_at, enc.data, enc.kind)
    return _dump(c)


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
