"""Context variables: the pipeline being traced, and the task being run.

``context()`` is what a task calls to learn its run id, task key, attempt
and idempotency key, to check for cancellation and to record lineage.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .keys import idempotency_key

if TYPE_CHECKING:
    from .pipeline import Build


class TaskCancelled(BaseException):
    """Raised by :meth:`RunContext.raise_if_cancelled`; ends the attempt as cancelled.

    A ``BaseException``, so a task's ``except Exception`` does not swallow it.
    Raise it yourself to stop an attempt that saw ``cancel_requested``: the
    attempt ends ``cancelled`` on every executor.
    """


class TaskTimedOut(BaseException):
    """Raised by a task that enforced its own time limit; ends the attempt as ``timeout``.

    Retried by the task's policy like any timeout (a program task raises it only
    after the program's whole process tree is gone).
    """


@dataclass(slots=True, kw_only=True)
class RunContext:
    """What a running task can know about itself.

    Example:
        >>> from ledgerflow import context
        >>> context().run_id
        'local'
    """

    run_id: str = "local"
    task_key: str = "local"
    attempt: int = 1
    _idempotency_key: str = ""
    _cancel: Callable[[], bool] | None = None
    lineage: list[tuple[str, str, str | None, dict[str, str]]] = field(default_factory=list)
    #: Propagation headers an observer attached to this attempt (W3C ``traceparent``
    #: when tracing is on), or None; program tasks pass them on as ``TRACEPARENT``...
    carrier: dict[str, str] | None = None

    @property
    def idempotency_key(self) -> str:
        """A key for side effects, the same for every attempt of this task in this run
        (also after a resume); hashed on first use."""
        if not self._idempotency_key:
            self._idempotency_key = "local" if self.run_id == "local" \
                else idempotency_key(self.run_id, self.task_key)
        return self._idempotency_key

    @property
    def cancel_requested(self) -> bool:
        """True once the run was asked to cancel or this attempt was abandoned."""
        return bool(self._cancel and self._cancel())

    def raise_if_cancelled(self) -> None:
        """Stop the attempt (outcome ``cancelled``) if cancellation was requested."""
        if self.cancel_requested:
            raise TaskCancelled(self.task_key)

    def record_input(self, uri: str, content_hash: str | None = None, **attrs: str) -> None:
        """Record that this attempt read the artifact ``uri`` (lineage)."""
        self.lineage.append(("input", uri, content_hash, {k: str(v) for k, v in attrs.items()}))

    def record_output(self, uri: str, content_hash: str | None = None, **attrs: str) -> None:
        """Record that this attempt wrote the artifact ``uri`` (lineage)."""
        self.lineage.append(("output", uri, content_hash, {k: str(v) for k, v in attrs.items()}))


_LOCAL = threading.local()
_current_task: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "ledgerflow_task", default=None)
#: The pipeline body being traced, if any (read on every task call: keep it cheap).
current_build: contextvars.ContextVar[Build | None] = contextvars.ContextVar(
    "ledgerflow_build", default=None)


def context() -> RunContext:
    """Return the context of the running task (a local one outside a run)."""
    ctx = _current_task.get()
    if ctx is None:
        ctx = getattr(_LOCAL, "ctx", None)
        if ctx is None:
            ctx = _LOCAL.ctx = RunContext()
    return ctx


def run_in_context(ctx: RunContext, fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` with ``ctx`` as the current task context."""
    token = _current_task.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        _current_task.reset(token)
