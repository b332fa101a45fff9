"""Approval gates: what a request is bound to (its digest), its options, and what an approver sees of it.

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

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import DefinitionError
from .keys import canonical, digest
from .states import PENDING_APPROVAL, ApprovalState

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
    """The approver name of the OS user deciding (see :mod:`ledgerflow.identity`)."""
    from .identity import decider
    return str(decider(None))


# -- what an approver sees: values rendered, bounded, secrets masked ------------------------

#: Argument and payload keys whose values are never shown (matched in the key's name).
SECRET_NAME = re.compile(r"pass(word|wd)?|secret|token|credential|authorization|^auth$|"
                         r"(api|access|private|signing)[_-]?key|^key$|cookie|session",
                         re.IGNORECASE)
MASK: Final = "***"
#: How long one rendered value may be.
VALUE_LIMIT: Final = 200


def secret_values() -> list[str]:
    """Known key values (of environment variables named like secrets), longest first."""
    vals = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 8}
    return sorted(vals, key=len, reverse=True)


def masked(value: Any) -> Any:
    """``value`` with the entries under secret-looking keys replaced by ``***``."""
    if isinstance(value, Mapping):
        return {k: MASK if isinstance(k, str) and SECRET_NAME.search(k) else masked(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v) for v in value]
    return value


def render(value: Any, name: str = "", limit: int = VALUE_LIMIT) -> str:
    """One value as an approver reads it: JSON where it can be, secrets masked, bounded."""
    if name and SECRET_NAME.search(name):
        return MASK
    try:
        text = json.dumps(masked(value), default=repr, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    for secret in secret_values():
        text = text.replace(secret, MASK)
    return text if len(text) <= limit else text[:limit - 1] + "…"


#: In a request's ``inputs``: keys of rendered argument (or payload field) values start
#: with this; the other keys are upstream task keys with their result hashes.
ARG = "arg:"
#: In an in-task request's ``inputs``: the task's code version when it asked.
VERSION = "code_version"
#: In an in-task request's ``inputs``: what an approver may edit (JSON text; see
#: :mod:`ledgerflow.edits`).
EDIT = "edit"


def line(values: Mapping[str, str], limit: int = 400) -> str:
    """Rendered values as one bounded line (``name=value, ...``)."""
    text = ", ".join(f"{k}={v}" for k, v in values.items())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def payload_fields(summary: str) -> tuple[str, dict[str, str]]:
    """An in-task payload (its JSON summary): the masked summary and its fields rendered
    (an object's keys; else one field ``payload``)."""
    try:
        value = json.loads(summary)
    except ValueError:      # cut at its bound, or not JSON: shown as it is, masked
        text = summary
        for secret in secret_values():
            text = text.replace(secret, "***")
        return text, {"payload": text}
    fields = ({str(k): render(v, str(k)) for k, v in value.items()}
              if isinstance(value, dict) else {"payload": render(value)})
    return render(masked(value), limit=400), fields


def unstable(action: str, before: Mapping[str, str], now: Mapping[str, str]) -> str:
    """Why an in-task request is refused: its payload changed although nothing it depends
    on did (naming the fields that changed)."""
    diff = changes(before, now)
    what = "; ".join(f"{c['field']}: {c['before']} -> {c['after']}" for c in diff[:5]) \
        or "its payload"
    return (f"the payload of {action!r} changes on every attempt ({what}): the approval "
            "given cannot apply; make it deterministic (compute the changing value in "
            "context().step(...) or leave it out of the payload)")


def changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[dict[str, Any]]:
    """The argument (or payload field) values that differ between two requests' inputs."""
    keys = [k for k in dict.fromkeys([*before, *now]) if k.startswith(ARG)]
    return [{"field": k[len(ARG):], "before": before.get(k), "after": now.get(k)}
            for k in keys if before.get(k) != now.get(k)]


def request_doc(row: Mapping[str, Any], previous: Mapping[str, Any] | None = None
                ) -> dict[str, Any]:
    """What an approver sees of a request (the CLI's ``--json``, the console, the hooks):
    its arguments (or payload fields) rendered and masked, the input hashes, the note,
    the approvers, the deadline, and ``changed``: what differs from ``previous`` (the
    last request of the same gate), None if there was none."""
    inputs = dict(row.get("inputs") or {})
    return {
        "run_id": row.get("run_id"), "task_key": row["task_key"], "action": row["action"],
        "summary": row["summary"], "digest": row["digest"],
        "arguments": {k[len(ARG):]: v for k, v in inputs.items() if k.startswith(ARG)},
        "inputs": {k: v for k, v in inputs.items()
                   if not k.startswith(ARG) and k not in (VERSION, EDIT)},
        "editable": EDIT in inputs,
        "requested_at": row.get("requested_at"), "deadline": row.get("deadline"),
        "on_timeout": row.get("on_timeout"), "approvers": list(row.get("approvers") or []),
        "note": row.get("note") or "", "state": row.get("state", PENDING_APPROVAL),
        "changed": None if previous is None
        else changes(dict(previous.get("inputs") or {}), inputs),
        "previous": None if previous is None else {
            "digest": previous["digest"], "state": previous.get("state"),
            "decided_by": previous.get("decided_by")},
    }


def previous_of(rows: list[dict[str, Any]], row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request of the same gate (task, action) made last before ``row``."""
    before = [r for r in rows if r["task_key"] == row["task_key"]
              and r["action"] == row["action"] and r["digest"] != row["digest"]
              and (r.get("requested_at") or 0) <= (row.get("requested_at") or 0)]
    return max(before, key=lambda r: r.get("requested_at") or 0) if before else None


class Decisions(dict[str, "Decision"]):
    """The decisions an attempt gets, remembering which digests it looked up: a request
    made next (:class:`ApprovalNeeded`) says which decisions that attempt used."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.used: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        found = super().get(key, default)
        if found is not None:
            self.used.add(key)
        else:
            _ASKING.used = frozenset(self.used)
        return found


_ASKING = threading.local()


@dataclass(frozen=True, slots=True)
class Decision:
    """A recorded decision, as ``context().approval()`` returns it; ``arguments``: the
    arguments the approver edited the payload's to (None: approved as asked)."""

    decision: str
    by: str = ""
    reason: str = ""
    at: float = 0.0
    digest: str = ""
    arguments: dict[str, Any] | None = None

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
                 gate: Approval | None = None, edit: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"approval needed for {action!r} ({digest[:12]})")
        self.action = action
        self.digest = digest
        self.summary = summary
        self.gate = gate or Approval()
        #: what the approver may edit ({"schema", "ref"}; None: nothing)
        self.edit = None if edit is None else dict(edit)
        #: the decisions this attempt used before asking (None: not known)
        used = getattr(_ASKING, "used", None)
        _ASKING.used = None
        self.used: list[str] | None = None if used is None else sorted(used)

    def request(self) -> dict[str, Any]:
        """The request as plain data (it travels back from worker processes)."""
        g = self.gate
        return {"action": self.action, "digest": self.digest, "summary": self.summary,
                "timeout": g.timeout, "on_timeout": g.on_timeout,
                "approvers": list(g.approvers), "note": g.note, "used": self.used,
                "edit": self.edit}
