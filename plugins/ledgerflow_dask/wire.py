"""What a Dask job carries, driver side: task specs shipped once, small jobs, compact answers.

A task's *spec* (its plain function and the fields every attempt of it in a
run shares: run id, task name, code version, echo, folders) is pickled once,
registered in every worker process once (``Client.run``) and named by an id;
:func:`ledgerflow_dask.worker.run_job` decodes it at its first use there. A
job then carries only that id, its job id, task key, attempt, its arguments
(as they are when they are small plain values, else cloudpickle bytes,
scattered first above ``scatter_above``) and the fields that differ from
their defaults. A worker that lacks the spec (it joined or restarted since)
answers :data:`~ledgerflow_dask.worker.MISSING`, and the job is sent again
with the spec inside. :func:`load_completion` turns the
worker's compact answer back into a :class:`~ledgerflow.executor.Completion`.
"""

from __future__ import annotations

import contextlib
import pickle
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ledgerflow.executor import Completion, Job
from ledgerflow.keys import digest
from ledgerflow.results import Encoded
from ledgerflow.task import Task

from .worker import forget_specs, register_spec

_NAME = re.compile(r"[^A-Za-z0-9_.]+")
_SCALARS = (int, float, str, bool, bytes, type(None))
#: Arguments travel as they are (Dask pickles them) only up to this many items and bytes.
_PLAIN_ITEMS = 256
_PLAIN_BYTES = 4096


@dataclass(slots=True)
class Spec:
    """One task's shipped spec: its id and bytes, and its jobs' key prefix."""

    id: str
    data: bytes
    prefix: str     # a job's Dask key is prefix + job id
    fn: Any         # kept so the id() in its cache key stays this function's


class Specs:
    """The specs this executor has shipped, by task and run (cleared at shutdown)."""

    def __init__(self, token: str, ship_modules: tuple[str, ...] = ()) -> None:
        self._token = token
        self._ship_modules = ship_modules
        self._by: dict[tuple[Any, ...], Spec] = {}
        self._shipped: set[str] = set()

    def get(self, client: Any, job: Job, topic: str | None) -> Spec:
        """The spec of ``job``'s task, registered on the workers now if it is new
        (``topic``: where its jobs push their starts and answers)."""
        key = (id(job.fn), job.run_id, job.code_version, job.task_name, job.echo,
               job.ledger_folder, job.run_folder)
        spec = self._by.get(key)
        if spec is not None:
            return spec
        fn = job.fn.fn if isinstance(job.fn, Task) else job.fn  # plain: pickles by value
        self._ship(fn)
        template = Job(id=0, run_id=job.run_id, task_key="", attempt=0, fn=fn, args=(),
                       kwargs={}, task_name=job.task_name, echo=job.echo,
                       code_version=job.code_version, ledger_folder=job.ledger_folder,
                       run_folder=job.run_folder)
        prefix = f"{_NAME.sub('_', job.task_name or 'task')}-{self._token}-"
        data = cloudpickle.dumps((template, topic, prefix), protocol=5)
        spec = self._by[key] = Spec(f"{prefix}{len(self._by)}", data, prefix, job.fn)
        client.run(register_spec, spec.id, data, on_error="ignore")
        return spec

    def _ship(self, fn: Any) -> None:
        """Pickle a pipeline module by value if the workers may not import it."""
        name = getattr(fn, "__module__", None) or ""
        if name in self._shipped:
            return
        self._shipped.add(name)
        mod = sys.modules.get(name)
        if mod is None or name == "__main__":
            return
        if getattr(mod, "__ledgerflow_file__", None) or name in self._ship_modules:
            cloudpickle.register_pickle_by_value(mod)

    def clear(self, client: Any) -> None:
        """Forget every spec, here and in the workers."""
        ids, self._by = [s.id for s in self._by.values()], {}
        if ids and client is not None:
            with contextlib.suppress(Exception):
                client.run(forget_specs, ids, on_error="ignore")


def extras(job: Job) -> dict[str, Any] | None:
    """The per-job fields that differ from their defaults (None if none do)."""
    out: dict[str, Any] = {}
    if job.idempotency_key:
        out["idempotency_key"] = job.idempotency_key
    if job.timeout is not None:
        out["timeout"] = job.timeout
    if job.approvals:
        out["approvals"] = job.approvals
    if job.steps:
        out["steps"] = job.steps
    if job.carrier is not None:
        out["carrier"] = job.carrier
    return out or None


def plain(value: Any) -> bool:
    """True if ``value`` is small and made of builtin scalars, lists, tuples and dicts
    (so plain pickle, which Dask uses, carries it as it is)."""
    budget = [_PLAIN_ITEMS, _PLAIN_BYTES]

    def walk(v: Any) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        t = type(v)
        if t in _SCALARS:
            if t is str or t is bytes:
                budget[1] -= len(v)
                return budget[1] >= 0
            return True
        if t is list or t is tuple:
            return all(walk(x) for x in v)
        if t is dict:
            return all(type(k) is str and walk(x) for k, x in v.items())
        return False

    return walk(value)


def arguments(job: Job) -> tuple[Any, Any]:
    """``(args, kwargs)`` as they travel: themselves if :func:`plain`, else
    ``(cloudpickle bytes, None)``."""
    if plain(job.args) and plain(job.kwargs):
        return job.args, job.kwargs
    return cloudpickle.dumps((job.args, job.kwargs), protocol=5), None


def load_completion(job_id: int, data: Any) -> Completion:
    """Turn what :func:`~ledgerflow_dask.worker.run_job` returned into a Completion."""
    if type(data) is tuple or type(data) is list:   # a plain success (a list if pushed)
        raw = data[2]
        kind = data[3] if len(data) > 3 else "json"
        return Completion(job_id, "ok", encoded=Encoded(kind, raw, digest(raw)),
                          started_at=data[0], ended_at=data[1], has_value=False)
    c = pickle.loads(data)
    if not isinstance(c, Completion):
        raise TypeError(f"a Dask job returned {type(c).__name__}, not a Completion")
    return c


def decode(job_id: int, data: Any, submitted: float) -> Completion:
    """:func:`load_completion`, or an ``error`` Completion saying why it failed."""
    try:
        return load_completion(job_id, data)
    except Exception as exc:
        return failure(job_id, submitted, exc, "the result could not be loaded")


def stopped(job_id: int, submitted: float) -> Completion:
    """A job the executor stopped (or that Dask cancelled on request)."""
    return Completion(job_id, "cancelled", started_at=submitted, ended_at=time.time(),
                      has_value=False)


def failure(job_id: int, submitted: float, exc: BaseException | None,
            what: str = "Dask could not run it") -> Completion:
    """A job Dask failed to run, or whose answer could not be loaded."""
    return Completion(job_id, "error", error=exc, error_type=type(exc).__name__,
                      error_message=f"{what}: {exc}"[:2000], started_at=submitted,
                      ended_at=time.time(), has_value=False)
