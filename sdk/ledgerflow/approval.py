"""Approval gates: what a request is bound to (its digest), and the gate's options.

A gate on a task (``@task(approve=True)`` or ``approve=Approval(...)``) asks
before the task's first attempt; a gate inside a task
(``context().approval(action, payload)``) asks when the code reaches it. Each
request carries a **digest** over exactly what is approved: the run, the task,
its code version, and either its canonical arguments and input hashes (a task
gate) or the action and canonical payload (an in-task gate). A decision
applies to that digest only: changed arguments, inputs or payload make a new
request that needs a new decision.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import DefinitionError
from .keys import canonical, digest
from .states import ApprovalState

#: ``on_timeout`` values: a request past its deadline ends ``failed`` with reason
#: ``expired`` (``fail``) or ``rejected`` (``reject``). There is no approve-on-timeout.
ON_TIMEOUT: Final = ("fail", "reject")
#: Decisions, as stored (the values of :class:`~ledgerflow.states.ApprovalState`).
APPROVED, REJECTED, EXPIRED = (ApprovalState.APPROVED.value, ApprovalState.REJECTED.value,
                               ApprovalState.EXPIRED.value)
#: The pipeline that drafts specs (its drafts are approved by file: pipeline approve-draft).
DRAFTING: Final = "drafting"


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """How a gate asks: deadline, what happens at it, who may decide, a note.

    Example:
        >>> Approval(timeout=3600, on_timeout="reject", approvers=["ana"]).on_timeout
        'reject'
    """

    timeout: float | None = None
    on_timeout: str = "fail"
    approvers: tuple[str, ...] = ()
    note: str = ""
    action: str = ""

    def __post_init__(self) -> None:
        if self.on_timeout not in ON_TIMEOUT:
            raise DefinitionError(
                f"on_timeout must be one of {', '.join(ON_TIMEOUT)}, given: {self.on_timeout!r}",
                hint='use on_timeout="fail" (expired) or on_timeout="reject"')
        if self.timeout is not None and self.timeout <= 0:
            raise DefinitionError(f"an approval timeout must be positive, given: {self.timeout}",
                                  hint="pass timeout=None for no deadline")
        object.__setattr__(self, "approvers", tuple(self.approvers))


def gate_of(approve: bool | Approval | Mapping[str, Any] | None) -> Approval | None:
    """The gate a task's ``approve=`` option asks for (None: no gate)."""
    if approve is None or approve is False:
        return None
    if approve is True:
        return Approval()
    if isinstance(approve, Approval):
        return approve
    if isinstance(approve, Mapping):
        return Approval(**dict(approve))
    raise DefinitionError(f"approve= takes True, an Approval(...) or a dict, given: {approve!r}",
                          hint="e.g. @task(approve=Approval(timeout=3600))")


def task_digest(run_id: str, task_key: str, version: str, literals: bytes,
                inputs: Iterable[str]) -> str:
    """The digest of a task gate: run, task, code version, arguments, input hashes."""
    return digest(b"\x00".join([b"task-gate", run_id.encode(), task_key.encode(),
                                version.encode(), literals, *(i.encode() for i in inputs)]))


def action_digest(run_id: str, task_key: str, version: str, action: str,
                  payload: object) -> str:
    """The digest of an in-task gate: task identity, action and canonical payload."""
    return digest(b"\x00".join([b"action-gate", run_id.encode(), task_key.encode(),
                                version.encode(), action.encode(), canonical(payload)]))


def summarize(params: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any],
              limit: int = 400) -> str:
    """A readable one-line summary of a call's literal arguments."""
    parts = [f"{name}={_short(v)}" for name, v in zip(params, args, strict=False)]
    parts += [f"{k}={_short(v)}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


def who() -> str:
    """The OS user deciding (when ``--as`` is not given)."""
    try:
        return getpass.getuser()
    except Exception:   # no user name (containers): still a decision, by someone
        return "unknown"


@dataclass(frozen=True, slots=True)
class Decision:
    """A recorded decision, as ``context().approval()`` returns it."""

    decision: str
    by: str = ""
    reason: str = ""
    at: float = 0.0
    digest: str = ""

    @property
    def approved(self) -> bool:
        return self.decision == APPROVED

    def __bool__(self) -> bool:
        return self.approved


class ApprovalNeeded(BaseException):
    """Raised by ``context().approval()`` when no decision exists yet for its digest.

    A control-flow signal, not an error: the attempt ends with outcome
    ``waiting``, the task waits for a decision, then runs again from the start.
    """

    def __init__(self, action: str, digest: str, summary: str,
                 gate: Approval | None = None) -> None:
        super().__init__(f"approval needed for {action!r} ({digest[:12]})")
        self.action = action
        self.digest = digest
        self.summary = summary
        self.gate = gate or Approval()

    def request(self) -> dict[str, Any]:
        """The request as plain data (it travels back from worker processes)."""
        g = self.gate
        return {"action": self.action, "digest": self.digest, "summary": self.summary,
                "timeout": g.timeout, "on_timeout": g.on_timeout,
                "approvers": list(g.approvers), "note": g.note}
