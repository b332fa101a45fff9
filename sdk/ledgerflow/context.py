"""Context variables: the pipeline being traced, and the task being run.

``context()`` is what a task calls to learn its run id, task key, attempt
and idempotency key, to check for cancellation and to record lineage.
"""

from __future__ import annotations

import base64
import contextvars
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .approval import Approval, ApprovalNeeded, Decision, action_digest
from .attempt_log import append_call, append_step
from .errors import PluginError
from .keys import idempotency_key
from .results import decode, encode

if TYPE_CHECKING:
    from .pipeline import Build

T = TypeVar("T")


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
    #: The task's code version (part of what an in-task approval is bound to).
    code_version: str = ""
    _approvals: dict[str, Decision] = field(default_factory=dict)
    _steps: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Steps this attempt did: (name, kind, data, content hash), recorded when it ends.
    steps_done: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: Folders workers on this machine may keep durable files in for the ledger and
    #: this run (budgets, rate limits); None for stores without a folder.
    ledger_folder: str | None = None
    run_folder: str | None = None
    #: Model and tool calls made by this attempt (``record_model_call`` ...).
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    #: Notices this attempt raised: (kind, message, time), recorded when it ends.
    notices: list[tuple[str, str, float]] = field(default_factory=list)
    #: Per-attempt state plugins keep on the context (e.g. an agent's call sequence).
    extensions: dict[str, Any] = field(default_factory=dict)

    def record_model_call(self, **call: Any) -> None:
        """Record one model call (fields of :class:`ledgerflow.records.ModelCall`).

        Kept in the run's folder at once too, so the call is in the ledger even
        when the process dies before the attempt ends (journaled on resume).
        """
        self.model_calls.append(call)
        self._log_call("model", call)

    def record_tool_call(self, **call: Any) -> None:
        """Record one tool call (fields of :class:`ledgerflow.records.ToolCall`)."""
        self.tool_calls.append(call)
        self._log_call("tool", call)

    def notice(self, kind: str, message: str) -> None:
        """Record a notice for this attempt (``pipeline status`` and ``Run.notices()``
        show it), e.g. before raising a :class:`~ledgerflow.errors.NonRetryableError`.

        Example:
            >>> context().notice("tool_not_allowed", "the model asked for 'rm'")
        """
        at = time.time()
        self.notices.append((kind, message, at))
        self._log_call("notice", {"kind": kind, "message": message, "ts": at})

    def _log_call(self, kind: str, fields: dict[str, Any]) -> None:
        if self.run_folder:
            append_call(self.run_folder, self.task_key, self.attempt, kind, fields)

    def model(self, *args: Any, **kwargs: Any) -> Any:
        """Call a model from this task: budgeted, rate limited, recorded, replayed.

        Delegates to the plugin registered under the entry point ``model`` of
        the ``ledgerflow.context`` group (``ledgerflow_agents.model_call``,
        whose arguments it takes), loaded on first use.

        Example:
            >>> context().model("Say hi", model="local").text   # doctest: +SKIP
            'Hi!'
        """
        return context_method("model")(*args, **kwargs)

    def approval(self, action: str, payload: object = None, *, timeout: float | None = None,
                 on_timeout: str = "fail", approvers: Sequence[str] = (),
                 note: str = "", edit: Mapping[str, Any] | None = None) -> Decision:
        """Ask a person to approve ``action`` with ``payload``; return the decision.

        The request is bound to a digest of this task, its code version, the
        action and the canonical payload. When a decision for that digest is
        recorded, it is returned (check ``.approved``). Otherwise the attempt
        stops here (outcome ``waiting``), the task waits in ``waiting_approval``,
        and once decided the task runs again **from the start**, this call now
        returning the decision. Wrap work done before the gate in
        :meth:`step` so it is not repeated. ``edit={"schema": ..., "ref": ...}`` lets
        the approver change the payload's ``arguments`` (checked against the JSON
        schema; they come back as the decision's ``arguments``: :mod:`ledgerflow.edits`).

        Example:
            >>> ctx = context()
            >>> ok = ctx.approval("send", {"to": "ops"})     # doctest: +SKIP
        """
        d = action_digest(self.run_id, self.task_key, self.code_version, action, payload)
        found = self._approvals.get(d)
        if found is not None:
            return found
        raise ApprovalNeeded(action, d, _summary(payload),
                             Approval(timeout=timeout, on_timeout=on_timeout,
                                      approvers=tuple(approvers), note=note, action=action),
                             edit)

    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once for this task: its result is recorded, and a
        re-run of the task (after an approval, a retry or a resume) gets it back
        instead of calling ``fn`` again.

        The result is recorded when the attempt ends (whatever its outcome), so a
        crash of the process during the attempt re-runs the step (at-least-once).
        Name steps uniquely within the task.

        Example:
            >>> context().step("fetch", lambda: 41 + 1)
            42
        """
        done = self._steps.get(name)
        if done is not None:
            return step_value(*done)  # type: ignore[return-value]
        value = fn(*args, **kwargs)
        kind, data, chash = step_data(value)
        self._steps[name] = (kind, data)
        self.steps_done.append((name, kind, data, chash))
        if self.run_folder:
            append_step(self.run_folder, self.task_key, self.attempt, name, kind, data, chash)
        return value

    def recorded_step(self, name: str) -> tuple[bool, Any]:
        """``(True, value)`` if the step ``name`` was recorded for this task, else
        ``(False, None)``: for callers that check before doing the work."""
        done = self._steps.get(name)
        return (True, step_value(*done)) if done is not None else (False, None)

    def record_step(self, name: str, value: object) -> None:
        """Record ``value`` as the result of the step ``name`` (see :meth:`step`)."""
        kind, data, chash = step_data(value)
        self._steps[name] = (kind, data)
        self.steps_done.append((name, kind, data, chash))
        if self.run_folder:
            append_step(self.run_folder, self.task_key, self.attempt, name, kind, data, chash)

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


def _summary(payload: object) -> str:
    try:
        text = json.dumps(payload, default=repr, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(payload)
    return text if len(text) <= 400 else text[:399] + "…"


def step_data(value: object) -> tuple[str, str, str]:
    """A step result as (kind, text, content hash) for the journal."""
    enc = encode(value)
    text = enc.data.decode() if enc.kind == "json" else base64.b64encode(enc.data).decode()
    return enc.kind, text, enc.hash


_METHODS: dict[str, Callable[..., Any]] = {}


def context_method(name: str) -> Callable[..., Any]:
    """The function a plugin adds to :class:`RunContext` as ``name`` (entry point
    ``name`` of the ``ledgerflow.context`` group), loaded once per process."""
    fn = _METHODS.get(name)
    if fn is None:
        from .entrypoints import entry_points
        found = [ep for ep in entry_points("ledgerflow.context") if ep.name == name]
        if not found:
            raise PluginError(f"no installed plugin provides context().{name}()",
                              hint="pip install the plugin that provides it (for model(): "
                                   "ledgerflow's agents plugin, ledgerflow_agents)")
        fn = _METHODS[name] = found[0].load()
    return fn


def step_value(kind: str, text: str) -> object:
    """The value of a recorded step result."""
    return decode(kind, text.encode() if kind == "json" else base64.b64decode(text))


class Deferred:
    """A task's context not built yet: :func:`context` builds it on the first call.

    Most tasks never ask for their context; an attempt sets one of these
    (a subclass that defines :meth:`build`) and pays for a :class:`RunContext`
    only if the task asks. ``ctx`` is the context once built, else None.
    """

    __slots__ = ("ctx",)

    def __init__(self) -> None:
        self.ctx: RunContext | None = None

    def build(self) -> RunContext:
        """Make the context (called once, on first use)."""
        raise NotImplementedError

    def get(self) -> RunContext:
        """The context, built now if it was not yet."""
        ctx = self.ctx
        if ctx is None:
            with _BUILDING:     # threads that copied the task's context may ask at once
                ctx = self.ctx
                if ctx is None:
                    ctx = self.ctx = self.build()
        return ctx


_BUILDING = threading.Lock()
_LOCAL = threading.local()
_current_task: contextvars.ContextVar[RunContext | Deferred | None] = contextvars.ContextVar(
    "ledgerflow_task", default=None)
#: The pipeline body being traced, if any (read on every task call: keep it cheap).
current_build: contextvars.ContextVar[Build | None] = contextvars.ContextVar(
    "ledgerflow_build", default=None)


def context() -> RunContext:
    """Return the context of the running task (a local one outside a run)."""
    ctx = _current_task.get()
    if ctx is None:
        local: RunContext | None = getattr(_LOCAL, "ctx", None)
        if local is None:
            local = _LOCAL.ctx = RunContext()
        return local
    if isinstance(ctx, Deferred):
        return ctx.get()
    return ctx


def run_in_context(ctx: RunContext | Deferred, fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` with ``ctx`` (or the context it builds) as the current task context."""
    token = _current_task.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        _current_task.reset(token)
