"""One tool call of the model, dispatched: allowlist, replay, approval, budget, guard, record.

:func:`call_tool` is what :meth:`ledgerflow_agents.calls.Session.call_tool`
does: a tool not on the allowlist fails the task at once (a notice says
why); a recorded call of the same tool and arguments is replayed without
running it; arguments are checked and paths resolved inside the tool's roots
(bad ones go back to the model as an error it can fix); an ``approve=``
tool waits for a person, who may edit its arguments (the tool then runs with
those, checked again, and the model reads that call's result); the call is reserved in the task's and run's tool
budgets; the tool runs under :mod:`ledgerflow_agents.guard`; its result (or
its exception text, a SystemExit too, known key values redacted) is what the model reads next,
and a ``tool_calls`` row and a step record keep it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._canonical import canonical_json, digest
from .budget import Amount, Owner
from .errors import BudgetExceeded, GovernanceError, PathNotAllowed, ToolNotAllowed
from .governance import Governance, observe, result_text
from .guard import Guard, guarded
from .redact import redact
from .tools import InvalidArguments, Tool

if TYPE_CHECKING:
    from .calls import Session

__all__ = ["call_tool", "refused", "tool_done"]

#: outcomes of a call that went back to the model as an error it can correct
_CORRECTABLE = ("refused", "invalid")


def call_tool(self: Session, tools: Mapping[str, Tool], call: Mapping[str, Any],
              bound: Mapping[str, Any], approve: Sequence[str], gov: Governance,
              max_chars: int | None = None, corrections: int = 0) -> str:
    """Dispatch one tool call of the model in ``self``'s attempt (see the module doc).

    Returns the text the model reads next (a result, or why the call did
    not run). A refused call (a tool not allowed, a path outside the roots,
    what the guard stopped) or invalid arguments go back to the model as an
    error while the attempt has ``corrections`` left (``self.corrections``
    counts them); past that it raises ToolNotAllowed or PathNotAllowed (after
    a notice).
    """
    seq, name = self._next()
    tname = str(call.get("name"))
    args = dict(call.get("arguments") or {})
    adigest = digest({"tool": tname, "arguments": args})
    base = {"seq": seq, "tool": tname, "arguments_digest": adigest, "replayed": False}
    recorded = self._recorded(name, "tool", {"tool": tname, "arguments": adigest})
    if recorded is not None:
        if recorded["call"].get("outcome") in _CORRECTABLE:
            self.corrections += 1
        self.ctx.record_tool_call(**{**recorded["call"], "replayed": True})
        return str(recorded["text"])
    if tname not in tools:
        return refused(self, name, base, corrections, ToolNotAllowed(
            f"the model called tool {tname!r}, which is not allowed (allowed: "
            f"{', '.join(tools) or 'none'})"), "not allowed")
    t = tools[tname]
    try:
        prepared = t.prepare(args, bound)
    except InvalidArguments as exc:
        why = redact(str(exc), [gov.key])
        if self.corrections >= corrections:
            self.ctx.record_tool_call(**base, outcome="invalid", error=why)
            raise self._refuse(ToolNotAllowed(
                f"the model called {tname} with invalid arguments after {corrections} "
                f"correction(s): {why}", hint="raise corrections=, or describe the tool's "
                "arguments better in its docstring")) from None
        self.corrections += 1
        return tool_done(self, name, base, "invalid", f"error: invalid arguments: {why}", why)
    except PathNotAllowed as exc:
        return refused(self, name, base, corrections, exc)
    approved_by, edited = "", ""
    if tname in approve:
        decision = self.ctx.approval(f"tool:{tname}", {"tool": tname, "arguments": args},
                                     note=f"the agent wants to call {tname}",
                                     edit={"schema": t.parameters, "ref": adigest})
        if not decision.approved:
            return tool_done(self, name, {**base, "approved_by": decision.by}, "rejected",
                             f"error: a person rejected this call "
                             f"({decision.reason or 'no reason given'})", decision.reason)
        approved_by = decision.by or "?"
        if decision.arguments is not None:      # the person edited the call's arguments
            try:
                prepared = t.prepare(decision.arguments, bound)
            except (InvalidArguments, PathNotAllowed) as exc:
                why = redact(str(exc), [gov.key])
                return tool_done(self, name, {**base, "approved_by": approved_by}, "invalid",
                                 f"error: the arguments a person approved are invalid: {why}",
                                 why)
            edited = (f"note: {approved_by} approved this call with edited arguments "
                      f"{canonical_json(decision.arguments).decode()}\n")
    scopes = self.scopes(gov, key=False)
    rid = digest([self.task_scope, self.ctx.attempt, seq, "tool", self.local_id])[7:39]
    ledger = self.ledger()
    if scopes:
        try:
            ledger.reserve(rid, scopes, Amount(tool_calls=1), Owner.me())
        except BudgetExceeded as exc:
            self.ctx.record_tool_call(**base, approved_by=approved_by,
                                      outcome="refused", error=str(exc))
            raise self._refuse(exc) from None
    guard = Guard(tname, prepared.reads, prepared.writes, t.network, t.spawn,
                  code=Guard.code_of(t.fn))
    outcome, error, value = "ok", "", None
    try:
        with observe("tool_call", tname, call_id=str(call.get("id") or "")), \
                guarded(guard):
            try:
                value = t.fn(**prepared.kwargs)
            except GovernanceError:
                pass                    # the guard refused: it is in guard.violations
            except (Exception, SystemExit) as exc:   # the model reads it and may try again
                # (SystemExit: a tool wrapping argparse refused a flag the model chose)
                # never a key it quotes: the text is stored and sent to the model
                outcome, error = "error", redact(f"{type(exc).__name__}: {exc}",
                                                 [gov.key])
            except BaseException as exc:   # ends the attempt: its text is stored, redacted
                exc.args = tuple(redact(a, [gov.key]) if isinstance(a, str) else a
                                 for a in exc.args)
                raise
    finally:
        over = ledger.settle(rid, scopes, Amount(tool_calls=1)) if scopes else []
    if guard.violations:
        kind, message = guard.violations[0]
        exc_type = PathNotAllowed if kind == "path_not_allowed" else ToolNotAllowed
        done = refused(self, name, {**base, "approved_by": approved_by}, corrections,
                       exc_type(message))
        if over:
            raise self._over(over)
        return done
    text = redact(edited + (result_text(value, max_chars) if outcome == "ok"
                            else f"error: {error}"), [gov.key])
    done = tool_done(self, name, {**base, "approved_by": approved_by}, outcome, text, error)
    if over:
        raise self._over(over)
    return done

def refused(self: Session, name: str, base: dict[str, Any], corrections: int,
            exc: GovernanceError, error: str | None = None) -> str:
    """A call governance refused: back to the model as an error while corrections are
    left (a ``refused`` row and a notice either way), else the task fails with ``exc``."""
    error = str(exc) if error is None else error
    if self.corrections >= corrections:
        self.ctx.record_tool_call(**base, outcome="refused", error=error)
        raise self._refuse(exc)
    self.corrections += 1
    self.ctx.notice(exc.kind, redact(f"{exc} (sent back to the model as an error: correction "
                                     f"{self.corrections} of {corrections})"))
    return tool_done(self, name, base, "refused", f"error: refused: {redact(str(exc))}", error)


def tool_done(self: Session, name: str, base: dict[str, Any], outcome: str, text: str,
              error: str) -> str:
    """Record a finished tool call (a ``tool_calls`` row and its replayable step)."""
    rec = {"approved_by": "", **base, "outcome": outcome, "result_hash": digest(text),
           "error": error[:2000]}
    self.ctx.record_tool_call(**rec)
    self._record_step(name, {"kind": "tool", "tool": base["tool"],
                             "arguments": base["arguments_digest"], "text": text,
                             "call": rec})
    return text
