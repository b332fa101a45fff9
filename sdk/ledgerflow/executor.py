"""The executor interface, and the code that runs one attempt in a worker.

An executor receives :class:`Job`\\ s and reports each one exactly once
through ``on_complete`` with a :class:`Completion` (a misbehaving executor
may report more; the runner rejects extras). Executors never touch the
ledger. ``ledgerflow.testing.ExecutorContract`` is the contract suite.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from . import capture
from .approval import ApprovalNeeded
from .context import Deferred, RunContext, TaskCancelled, TaskTimedOut, run_in_context
from .errors import NotResumableError
from .redact import redact
from .results import Encoded, encode
from .states import Outcome
from .tracebacks import user_traceback

_OK, _ERROR, _TIMEOUT = Outcome.OK.value, Outcome.ERROR.value, Outcome.TIMEOUT.value
_CANCELLED, _WAITING = Outcome.CANCELLED.value, Outcome.WAITING.value


@runtime_checkable
class Carrier(Protocol):
    """What an observer attaches to an attempt (``ledgerflow_job_carrier``).

    It travels with the :class:`Job` (pickled with it, so its class must be
    importable wherever the job runs) and :func:`execute` enters
    :meth:`scope` around the task call, in whatever process runs it.
    ``headers`` (e.g. W3C ``traceparent``) are what a task sees as
    ``context().carrier`` and program tasks get as environment variables.
    """

    headers: dict[str, str]

    def scope(self) -> AbstractContextManager[Any]:
        """A context manager to enter around the task call."""
        ...


@dataclass(slots=True, kw_only=True)
class Job:
    """One attempt of one task, as handed to an executor."""

    id: int
    run_id: str
    task_key: str
    attempt: int
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    idempotency_key: str = ""       # "" = derived from run id and task key when asked for
    timeout: float | None = None
    task_name: str = ""
    #: Echo the attempt's output to stderr, prefixed with the task key, as it is written.
    echo: bool = False
    #: The task's code version, and what is recorded for it: decisions of its in-task
    #: approval gates (digest -> Decision) and results of its steps (name -> kind, data).
    code_version: str = ""
    approvals: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Folders workers may keep durable files in (step logs go to the run folder).
    ledger_folder: str | None = None
    run_folder: str | None = None
    #: What an observer attached to this attempt (``ledgerflow_job_carrier``), or None.
    carrier: Carrier | None = None

    @classmethod
    def of_attempt(cls, id: int, run_id: str, task_key: str, attempt: int,
                   fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   timeout: float | None, task_name: str, echo: bool, code_version: str,
                   approvals: dict[str, Any], steps: dict[str, tuple[str, str]],
                   ledger_folder: str | None, run_folder: str | None) -> Job:
        """The Job the keyword constructor makes, built a quarter as slowly (the runner
        makes one an attempt); its idempotency key derived, no carrier yet."""
        job = object.__new__(cls)
        job.id, job.run_id, job.task_key, job.attempt = id, run_id, task_key, attempt
        job.fn, job.args, job.kwargs, job.idempotency_key = fn, args, kwargs, ""
        job.timeout, job.task_name, job.echo, job.code_version = (timeout, task_name, echo,
                                                                  code_version)
        job.approvals, job.steps, job.carrier = approvals, steps, None
        job.ledger_folder, job.run_folder = ledger_folder, run_folder
        return job


@dataclass(slots=True)
class Completion:
    """What an executor reports when an attempt ends.

    ``outcome`` is ``ok``, ``error``, ``cancelled``, ``timeout`` (the task raised
    :class:`~ledgerflow.context.TaskTimedOut`) or ``lost``; the runner also
    decides ``timeout`` itself when no result came in time.
    """

    job_id: int
    outcome: str
    value: Any = None
    encoded: Encoded | None = None
    error: BaseException | None = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    #: (the sequences default to one shared empty tuple: most attempts have none)
    lineage: Sequence[tuple[str, str, str | None, dict[str, str]]] = ()
    has_value: bool = True
    #: What the attempt wrote (stdout, stderr, logging), and how much was cut from it.
    log: str = ""
    log_dropped: int = 0
    #: Outcome ``waiting``: the in-task gate it stopped at (``ApprovalNeeded.request()``).
    approval: dict[str, Any] | None = None
    #: Steps the attempt did: (name, kind, data, content hash).
    steps: Sequence[tuple[str, str, str, str]] = ()
    #: Model and tool calls the attempt made (fields of ModelCall / ToolCall).
    model_calls: Sequence[dict[str, Any]] = ()
    tool_calls: Sequence[dict[str, Any]] = ()
    #: Notices the task raised (``context().notice``): (kind, message, time).
    notices: Sequence[tuple[str, str, float]] = ()

    @property
    def bare(self) -> bool:
        """True if the attempt reported nothing beyond how it ended (and its value): no
        output, calls, notices, steps or lineage (most attempts)."""
        return not (self.log or self.model_calls or self.tool_calls or self.notices
                    or self.steps or self.lineage)


@runtime_checkable
class Executor(Protocol):
    """What the runner needs from an executor plugin.

    Optional capabilities, as class attributes:

    * ``runs_in_driver = True``: the runner calls each attempt itself, in the
      driver thread, one at a time (the ``inline`` executor); ``submit`` is
      then used only by callers other than the runner.
    * ``inline_when_alone = True``: the runner may call a task in the driver
      thread when it is the only one that can run and has no timeout (a chain
      then pays no thread hand-off; the ``threads`` executor declares it).
    * ``queue_ahead = N``: the runner may keep up to ``N`` jobs submitted beyond
      ``workers``, so a cluster's queue does not run dry while results travel
      back (the ``dask`` executor). Only jobs without a timeout go ahead: a
      timeout is counted from the submit, so a job with one is submitted only
      when a worker is free for it, unless the executor declares
    * ``timeout_from_start = True``: the executor counts a job's timeout from
      the moment a worker starts it and reports outcome ``timeout`` itself; the
      runner then arms no timer of its own and queues timed jobs ahead too. A
      result that still comes after that report is reported as well (the
      runner rejects it as late and records a ``late_result_rejected`` notice).
    """

    name: str

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        """Prepare to run up to ``workers`` jobs at once."""

    def submit(self, job: Job) -> None:
        """Start ``job``; report it later through ``on_complete``."""

    def cancel(self, job_id: int, *, reason: str) -> None:
        """Stop ``job_id`` if possible (reason: ``cancel`` or ``timeout``).

        Confirm with a Completion of outcome ``cancelled`` once it stopped.
        """

    def shutdown(self) -> None:
        """Release workers; called once per drive."""


class NoExecutor:
    """The executor of a run that is only recorded (``submit``): never started."""

    name = "none"

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        raise NotResumableError("a submitted run is not driven by the process that "
                                "submitted it", hint="drive it with: pipeline resume RUN_ID")

    def submit(self, job: Job) -> None:
        raise NotResumableError("a submitted run has no executor")

    def cancel(self, job_id: int, *, reason: str) -> None:
        return None

    def shutdown(self) -> None:
        return None


def not_started(job_id: int, exc: Exception) -> Completion:
    """The report of a job the executor refused to start (e.g. an unpicklable function)."""
    now = time.time()
    return Completion(job_id, _ERROR, error=exc, error_type=type(exc).__name__,
                      error_message=redact(f"executor could not start it: {exc}"),
                      started_at=now, ended_at=now, has_value=False)


def queue_ahead(executor: object) -> int:
    """How many jobs without a timeout ``executor`` takes beyond ``workers`` (see Executor)."""
    return max(0, int(getattr(executor, "queue_ahead", 0) or 0))


def timeout_from_start(executor: object) -> bool:
    """True if ``executor`` times each job from its start itself (see Executor)."""
    return bool(getattr(executor, "timeout_from_start", False))


def inline_when_alone(executor: object) -> bool:
    """True if ``executor`` lets a lone task run in the driver thread (see Executor)."""
    return bool(getattr(executor, "inline_when_alone", False))


def runs_in_driver(executor: object) -> bool:
    """True if the runner calls ``executor``'s attempts itself (see Executor)."""
    return bool(getattr(executor, "runs_in_driver", False))


class _Context(Deferred):
    """The context of one attempt, built only if the task asks (``context()``)."""

    __slots__ = ("cancel", "job")

    def __init__(self, job: Job, cancel: Callable[[], bool] | None) -> None:
        self.ctx = None
        self.job = job
        self.cancel = cancel

    def build(self) -> RunContext:
        job = self.job
        return RunContext(run_id=job.run_id, task_key=job.task_key, attempt=job.attempt,
                          _idempotency_key=job.idempotency_key, _cancel=self.cancel,
                          code_version=job.code_version, _approvals=job.approvals,
                          _steps=dict(job.steps),
                          ledger_folder=job.ledger_folder, run_folder=job.run_folder,
                          carrier=None if job.carrier is None else dict(job.carrier.headers))


def execute(job: Job, cancel: Callable[[], bool] | None = None, *,
            keep_value: bool = True) -> Completion:
    """Run ``job`` here and now; never raises (outcomes carry the errors).

    Whatever the task raises ends the attempt, ``BaseException``\\ s too
    (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``): they are
    outcome ``error`` and not retried unless ``retry_on`` names them.

    What the attempt writes to stdout, stderr and ``logging`` is captured into
    the Completion (:mod:`ledgerflow.capture`). The attempt pays only for what
    it uses: its :class:`~ledgerflow.context.RunContext` is built on the first
    ``context()`` call, and the capture keeps no buffers until something is written.
    """
    return call(job.id, job.task_key, job.fn, job.args, job.kwargs, _Context(job, cancel),
                echo=job.echo, carrier=job.carrier, keep_value=keep_value)


def call(job_id: int, key: str, fn: Callable[..., Any], args: tuple[Any, ...],
         kwargs: dict[str, Any], lazy: Deferred, echo: bool = False,
         carrier: Carrier | None = None, *, keep_value: bool = True) -> Completion:
    """One attempt of task ``key`` (``fn``, a Task or a plain function), here and now,
    with ``lazy`` as its context: what :func:`execute` does for a Job, for a caller
    that keeps no Job (the runner's own in-driver attempts)."""
    out, token = capture.start(key, echo=echo)
    try:
        c = _attempt(job_id, fn, args, kwargs, lazy, carrier, keep_value)
    finally:
        capture.stop(out, token)
    ctx = lazy.ctx
    if ctx is not None:     # the task asked for its context: what it recorded there
        c.lineage = ctx.lineage
        c.steps = ctx.steps_done
        c.model_calls = ctx.model_calls
        c.tool_calls = ctx.tool_calls
        c.notices = ctx.notices
    if out.head:        # what the task printed: known secret values out (ledgerflow.redact)
        c.log = redact(out.text())
        c.log_dropped = out.dropped
    return c


def _attempt(job_id: int, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], ctx: Deferred, carrier: Carrier | None,
             keep_value: bool) -> Completion:
    """One attempt with ``ctx`` as its (deferred) context; lineage etc. added by the caller."""
    started = time.time()
    inner = getattr(fn, "_plain", None)     # a Task: call its function directly
    try:
        if carrier is not None:
            with _carried(carrier):
                value = run_in_context(ctx, inner or fn, args, kwargs)
        else:
            value = run_in_context(ctx, inner or fn, args, kwargs)
    except TaskCancelled:
        return Completion(job_id, _CANCELLED, started_at=started, ended_at=time.time(),
                          has_value=False)
    except ApprovalNeeded as need:   # stopped at an in-task gate: runs again once decided
        return Completion(job_id, _WAITING, error_type="ApprovalNeeded",
                          error_message=f"waiting for approval of {need.action!r}",
                          started_at=started, ended_at=time.time(),
                          has_value=False, approval=need.request())
    except TaskTimedOut as exc:     # no error object: a timeout is retried by policy
        return Completion(job_id, _TIMEOUT, error_type="TaskTimedOut",
                          error_message=_message(exc) or "the task timed out",
                          started_at=started, ended_at=time.time(), has_value=False)
    except Exception as exc:    # its text, known secret values out, is the attempt's error
        return Completion(job_id, _ERROR, error=exc, error_type=type(exc).__name__,
                          error_message=_message(exc),
                          traceback=redact(user_traceback(exc)),
                          started_at=started, ended_at=time.time(), has_value=False)
    except BaseException as exc:    # SystemExit, KeyboardInterrupt, GeneratorExit, ...
        # user code ends its attempt, never the worker or the driver: an ``error``
        # that is not retryable (``retry_on`` names Exception subclasses by default)
        return Completion(job_id, _ERROR, error=exc, error_type=type(exc).__name__,
                          error_message=redact(_base_message(exc)),
                          traceback=redact(user_traceback(exc)),
                          started_at=started, ended_at=time.time(), has_value=False)
    try:
        enc = encode(value)
    except Exception as exc:
        return Completion(job_id, _ERROR, error=exc, error_type=type(exc).__name__,
                          error_message=redact(f"result could not be serialised: {exc}"),
                          traceback=redact(user_traceback(exc)),
                          started_at=started, ended_at=time.time(), has_value=False)
    if keep_value:
        return Completion(job_id, _OK, value, enc, started_at=started, ended_at=time.time())
    return Completion(job_id, _OK, None, enc, started_at=started, ended_at=time.time(),
                      has_value=False)


def _message(exc: BaseException) -> str:
    """The error text of an exception a task raised, known secret values out, cut."""
    return redact(str(exc))[:2000]


def _base_message(exc: BaseException) -> str:
    """The error text of a BaseException a task raised (``SystemExit(3)`` says its code)."""
    if isinstance(exc, SystemExit):
        return f"the task raised SystemExit (exit code {exc.code!r}); its attempt failed"
    return (_message(exc) or f"the task raised {type(exc).__name__}") + \
        "; its attempt failed"


@contextmanager
def _carried(carrier: Carrier) -> Iterator[None]:
    """Enter ``carrier.scope()`` around the task call; an observer's failure to enter or
    leave it is logged, the task's own exceptions pass through unchanged."""
    log = logging.getLogger("ledgerflow")
    try:
        cm = carrier.scope()
        cm.__enter__()
    except Exception:  # observers must never break a run
        log.exception("entering an attempt carrier's scope failed")
        yield
        return
    try:
        yield
    except BaseException as exc:
        try:
            cm.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:
            log.exception("leaving an attempt carrier's scope failed")
        raise
    else:
        try:
            cm.__exit__(None, None, None)
        except Exception:
            log.exception("leaving an attempt carrier's scope failed")
