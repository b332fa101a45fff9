"""Governed calls inside a task: each model call and tool call a recorded, replayable step.

:func:`model_call` (also ``context().model(...)``) and the agent loop of
:func:`~ledgerflow_agents.agent_task` make every call through one
:class:`Session` per attempt, which gives each call a sequence number (model
and tool calls share it) and makes it a step of the task
(``context().record_step``, durable the moment it completes):

* **Replay.** On a retry, a re-run after an approval, or a resume after the
  process died, the recorded calls come back in order while the request is
  the same (model calls: the request digest; tool calls: the tool and the
  digest of its arguments). From the first call that differs, everything is
  called for real (a notice says where). A replayed call bills nothing and
  runs no tool: it is recorded with ``replayed=True``.
* **Budgets** (:mod:`ledgerflow_agents.budget`): the worst case is reserved
  in the task's, the run's and the key's budgets before the call, and
  settled to the real usage after.
* **Per-key limits** (:mod:`ledgerflow_agents.limits`): a slot of the key's
  limiter is held for the call; a 429's ``Retry-After`` makes every caller of
  the key wait, then the call is tried again (at most ``rate_limit_tries``).
* **Ledger.** Every try of a call is a ``model_calls`` row (a failed one with
  ``finish_reason`` ``rate_limited``, ``timeout``, ``malformed`` or
  ``error``), every tool call a ``tool_calls`` row; prompt and response text
  only with ``record_content=True``. Secrets never: a key is an alias (the
  environment variable's name), and known key values are taken out of tool
  errors and results, recorded content, notices and a provider's error
  message before they are stored or sent (:mod:`ledgerflow_agents.redact`).
* **Observability.** Real calls are reported through
  :mod:`ledgerflow_observability.genai` (``gen_ai.*`` spans when tracing is on).

Calls of one task should be made one after another: concurrent calls get
sequence numbers in the order they start, which a re-run may not repeat (its
replay then stops at the first difference, which is safe but bills again).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerflow.context import RunContext, context
from ledgerflow.errors import ConfigError

from ._canonical import digest
from .budget import Amount, Budget, BudgetLedger, Owner, Scope, ledger_for
from .errors import (
    BudgetExceeded,
    GovernanceError,
    MalformedResponse,
    ModelTimeout,
    PathNotAllowed,
    ProviderError,
    RateLimited,
    ToolNotAllowed,
)
from .guard import Guard, guarded
from .limits import KeyLimiter, KeyLimits, limiter_for
from .provider import ChatModel, ModelRequest, ModelResponse, Usage
from .redact import redact
from .tools import InvalidArguments, Tool, as_tool

__all__ = ["Governance", "Session", "model_call", "resolve_model"]

_EXT = "ledgerflow_agents"
STEP_PREFIX = "agents:"


@dataclass(frozen=True, slots=True, kw_only=True)
class Governance:
    """The budgets, key and limits a call is made under.

    Args:
        budget: the task's budget (over all its attempts).
        run_budget: the run's, shared by every task of the run that declares it.
        key: the key alias (environment variable name) the call bills.
        key_budget: the key's, shared by every run of the ledger on this machine.
        limits: the key's rate and concurrency limits.
        record_content: keep prompt and response text in the ledger.
        timeout: seconds per model call (None: the provider's default).
        retries: extra tries of a call after a timeout, a malformed answer
            or a retryable provider error, within the attempt.
        rate_limit_tries: tries of a call that gets 429s.
        max_retry_after: the longest Retry-After waited for; a longer one
            fails the attempt (retryably) instead.
    """

    budget: Budget | None = None
    run_budget: Budget | None = None
    key: str | None = None
    key_budget: Budget | None = None
    limits: KeyLimits | None = None
    record_content: bool = False
    timeout: float | None = None
    retries: int = 2
    rate_limit_tries: int = 5
    max_retry_after: float = 120.0


def _genai() -> Any:
    try:
        from ledgerflow_observability import genai
    except ImportError:         # the observability plugin is not installed
        return None
    return genai


@contextlib.contextmanager
def _observe(kind: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
    genai = _genai()
    if genai is None:
        yield None
        return
    with getattr(genai, kind)(*args, **kwargs) as call:
        yield call


def _cost(model: ChatModel, usage: Usage) -> float:
    return model.pricing.cost(usage.input_tokens, usage.output_tokens) if model.pricing else 0.0


def _checked(resp: ModelResponse) -> ModelResponse:
    """``resp`` once its usage is known to be whole non-negative counts.

    Any provider, ours or a plugin's, may answer with a usage object of its
    own: the counts are checked again here, so a negative or absurd one is a
    :class:`MalformedResponse` (billed at the reservation), never a credit.
    """
    usage = resp.usage
    Usage(getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None))
    return resp


def _scrubbed(exc: ProviderError, gov: Governance) -> ProviderError:
    """``exc`` with known key values out of its message and hint (it becomes the attempt's
    error in the ledger)."""
    exc.args = tuple(redact(a, [gov.key]) if isinstance(a, str) else a for a in exc.args)
    exc.hint = redact(exc.hint, [gov.key]) if exc.hint else exc.hint
    return exc


def result_text(value: object, limit: int | None = None) -> str:
    """A tool's result as the text the model reads (JSON unless it is a string)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                           ensure_ascii=False)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"… [{len(text) - limit} more characters cut]"
    return text


@dataclass(slots=True)
class Session:
    """The calls of one attempt of one task: sequence numbers, replay, recording."""

    ctx: RunContext
    durable: bool
    seq: int = 0
    diverged: bool = False
    told_scripted: bool = False
    local_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def of(cls, ctx: RunContext | None = None) -> Session:
        """The session of the running attempt (made on first use)."""
        ctx = ctx or context()
        found = ctx.extensions.get(_EXT)
        if not isinstance(found, Session):
            found = ctx.extensions[_EXT] = cls(ctx, durable=ctx.run_id != "local")
        return found

    # -- identity ---------------------------------------------------------------------
    @property
    def task_scope(self) -> str:
        c = self.ctx
        return f"{c.run_id}/{c.task_key}" if self.durable else f"local-{self.local_id}"

    @property
    def run_scope(self) -> str:
        return self.ctx.run_id if self.durable else f"local-{self.local_id}"

    def scopes(self, gov: Governance, *, key: bool = True) -> list[Scope]:
        out = []
        if gov.budget is not None:
            out.append(Scope("task", self.task_scope, gov.budget))
        if gov.run_budget is not None:
            out.append(Scope("run", self.run_scope, gov.run_budget))
        if key and gov.key_budget is not None and gov.key:
            out.append(Scope("key", gov.key, gov.key_budget))
        return out

    def ledger(self) -> BudgetLedger:
        return ledger_for(self.ctx.ledger_folder, self.ctx.run_folder)

    def limiter(self, alias: str | None) -> KeyLimiter | None:
        return None if not alias else limiter_for(alias, self.ctx.ledger_folder)

    def _next(self) -> tuple[int, str]:
        self.seq += 1
        return self.seq, f"{STEP_PREFIX}{self.seq}"

    def _recorded(self, name: str, kind: str, same: Mapping[str, Any]) -> dict[str, Any] | None:
        """The recorded step ``name`` if replay goes on and it is the same call."""
        if not self.durable or self.diverged:
            return None
        found, value = self.ctx.recorded_step(name)
        if not found:
            return None
        if isinstance(value, dict) and value.get("kind") == kind and all(
                value.get(k) == v for k, v in same.items()):
            return value
        self.diverged = True
        self.ctx.notice("replay_diverged",
                        f"call {name[len(STEP_PREFIX):]} differs from the one recorded "
                        "(the request changed): from here on every call is made again")
        return None

    def _record_step(self, name: str, value: dict[str, Any]) -> None:
        if self.durable:
            self.ctx.record_step(name, value)

    def _refuse(self, exc: GovernanceError) -> GovernanceError:
        self.ctx.notice(exc.kind, redact(str(exc)))
        return exc

    # -- model calls ------------------------------------------------------------------
    def call_model(self, model: ChatModel, request: ModelRequest,
                   gov: Governance) -> ModelResponse:
        """One model call, replayed when recorded (see the module docstring)."""
        seq, name = self._next()
        rdigest = request.digest()
        scopes = self.scopes(gov)
        recorded = self._recorded(name, "model", {"request": rdigest})
        if recorded is not None:
            call = dict(recorded["call"])
            if recorded.get("reservation") and scopes:     # an orphan of a dead process
                u = call
                self.ledger().settle(recorded["reservation"], scopes,
                                     Amount(int(u["input_tokens"]) + int(u["output_tokens"]),
                                            float(u["cost"]), 1, 0))
            self.ctx.record_model_call(**{**call, "replayed": True, "latency": 0.0})
            return ModelResponse.from_dict(recorded["response"])
        limiter = self.limiter(gov.key)
        sent = tries = rate_tries = 0
        while True:
            sent += 1
            tries += 1
            resp, error = self._try_model(model, request, gov, seq, name, sent, rdigest,
                                          scopes, limiter)
            if resp is not None:
                return resp
            assert error is not None
            if isinstance(error, RateLimited):
                rate_tries += 1
                wait = error.retry_after if error.retry_after is not None else \
                    min(2.0 ** rate_tries, 30.0)
                if rate_tries >= gov.rate_limit_tries or wait > gov.max_retry_after:
                    raise _scrubbed(error, gov)
                self.ctx.notice("rate_limited", f"{model.provider}/{model.model} answered 429"
                                f" (call {seq}); every caller of key {gov.key or '-'} "
                                f"waits {wait:g}s (Retry-After) before trying again")
                if limiter is not None:
                    limiter.block(wait)
                else:
                    time.sleep(wait)
                tries -= 1
                continue
            if error.retryable and tries <= gov.retries:
                continue
            raise _scrubbed(error, gov)

    def _try_model(self, model: ChatModel, request: ModelRequest, gov: Governance, seq: int,
                   name: str, tries: int, rdigest: str, scopes: list[Scope],
                   limiter: KeyLimiter | None) -> tuple[ModelResponse | None,
                                                        ProviderError | None]:
        estimate = model.estimate_input_tokens(request)
        worst = estimate + request.max_output_tokens
        worst_usd = model.pricing.cost(estimate, request.max_output_tokens) \
            if model.pricing else 0.0
        reserved = Amount(worst, worst_usd, 1, 0)
        rid = digest([self.task_scope, self.ctx.attempt, seq, tries, self.local_id])[7:39]
        ledger = self.ledger()
        if scopes:
            try:
                ledger.reserve(rid, scopes, reserved, Owner.me())
            except BudgetExceeded as exc:
                raise self._refuse(exc) from None
        settled = False

        def settle(actual: Amount) -> list[str]:
            nonlocal settled
            settled = True
            if limiter is not None:
                limiter.release(rid, actual.tokens)
            return ledger.settle(rid, scopes, actual) if scopes else []

        base = {"seq": seq, "provider": model.provider, "model": model.model,
                "key_alias": gov.key or "", "request_hash": rdigest,
                "reserved_tokens": worst, "reserved_cost": worst_usd, "replayed": False}
        if limiter is not None:
            try:
                limiter.acquire(rid, worst, gov.limits or KeyLimits(),
                                cancelled=lambda: self.ctx.cancel_requested)
            except BudgetExceeded as exc:
                settle(Amount())
                raise self._refuse(exc) from None
            except BaseException:
                settle(Amount())        # never sent: nothing spent
                raise
        try:
            started = time.monotonic()
            try:
                with _observe("model_call", model.provider, model.model,
                              max_tokens=request.max_output_tokens,
                              temperature=request.temperature) as span:
                    resp = _checked(model.complete(request, timeout=gov.timeout))
                    if span is not None:
                        span.usage(resp.usage.input_tokens, resp.usage.output_tokens,
                                   cost_usd=_cost(model, resp.usage),
                                   finish_reason=resp.finish_reason,
                                   response_model=resp.model)
            except ProviderError as exc:
                usage = exc.usage
                if usage is not None:
                    actual = Amount(usage.total_tokens, _cost(model, usage), 1, 0)
                elif isinstance(exc, RateLimited):
                    actual = Amount(0, 0.0, 1, 0)       # refused, not billed
                else:
                    actual = reserved                    # unknown: count the worst case
                over = settle(actual)
                kind = ("rate_limited" if isinstance(exc, RateLimited) else "timeout"
                        if isinstance(exc, ModelTimeout) else "malformed"
                        if isinstance(exc, MalformedResponse) else "error")
                in_t = usage.input_tokens if usage else (estimate if actual.tokens else 0)
                out_t = usage.output_tokens if usage else \
                    (request.max_output_tokens if actual.tokens else 0)
                self.ctx.record_model_call(**base, input_tokens=in_t, output_tokens=out_t,
                                           cost=actual.usd,
                                           latency=time.monotonic() - started,
                                           finish_reason=kind, tool_calls=[],
                                           response_hash="",
                                           content=self._content(gov, request, None, exc))
                if over:
                    raise self._over(over) from exc
                return None, exc
        except BaseException:
            if not settled:
                settle(reserved)       # stopped mid-call (cancelled ...): count the worst
            raise
        latency = time.monotonic() - started
        cost = _cost(model, resp.usage)
        actual = Amount(resp.usage.total_tokens, cost, 1, 0)
        call = {**base, "input_tokens": resp.usage.input_tokens,
                "output_tokens": resp.usage.output_tokens, "cost": cost, "latency": latency,
                "finish_reason": resp.finish_reason,
                "tool_calls": [c["name"] for c in resp.tool_calls],
                "response_hash": resp.response_digest,
                "content": self._content(gov, request, resp, None)}
        self.ctx.record_model_call(**call)
        if resp.scripted and not self.told_scripted:
            self.told_scripted = True
            self.ctx.notice("scripted_model",
                            f"{model.provider}/{model.model} is a scripted mock: its answers "
                            "are canned, not generated from the request")
        slim = {k: v for k, v in resp.to_dict().items() if k not in ("request", "response",
                                                                      "raw")}
        self._record_step(name, {"kind": "model", "request": rdigest, "response": slim,
                                 "call": {**call, "content": ""}, "reservation": rid})
        over = settle(actual)
        if actual.tokens > worst or actual.usd > worst_usd + 1e-12:
            self.ctx.notice("over_reservation",
                            f"call {seq} used {actual.tokens} tokens (${actual.usd:.6f}), more "
                            f"than its reservation of {worst} (${worst_usd:.6f}): the "
                            "provider ignored max_output_tokens or the input estimate was low")
        if over:
            raise self._over(over)
        return resp, None

    def _over(self, over: list[str]) -> BudgetExceeded:
        exc = BudgetExceeded("spent past a budget: " + "; ".join(over))
        self._refuse(exc)
        return exc

    @staticmethod
    def _content(gov: Governance, request: ModelRequest, resp: ModelResponse | None,
                 error: BaseException | None) -> str:
        if not gov.record_content:
            return ""
        out: dict[str, Any] = {"messages": [dict(m) for m in request.messages],
                               "tools": request.tool_names}
        if resp is not None:
            out["response"] = {"text": resp.text, "tool_calls": [dict(c) for c in
                                                                 resp.tool_calls]}
        if error is not None:
            out["error"] = f"{type(error).__name__}: {error}"
        return redact(json.dumps(out, ensure_ascii=False, sort_keys=True, default=str),
                      [gov.key])

    # -- tool calls -------------------------------------------------------------------
    def call_tool(self, tools: Mapping[str, Tool], call: Mapping[str, Any],
                  bound: Mapping[str, Any], approve: Sequence[str], gov: Governance,
                  max_chars: int | None = None) -> str:
        """Dispatch one tool call of the model: checked, approved, budgeted, guarded.

        Returns the text the model reads next (a result, or why the call did
        not run when the model can fix it). Raises ToolNotAllowed or
        PathNotAllowed (after a notice) when governance refuses it.
        """
        seq, name = self._next()
        tname = str(call.get("name"))
        args = dict(call.get("arguments") or {})
        adigest = digest({"tool": tname, "arguments": args})
        base = {"seq": seq, "tool": tname, "arguments_digest": adigest, "replayed": False}
        if tname not in tools:
            self.ctx.record_tool_call(**base, outcome="refused", error="not allowed")
            raise self._refuse(ToolNotAllowed(
                f"the model called tool {tname!r}, which is not allowed (allowed: "
                f"{', '.join(tools) or 'none'})"))
        recorded = self._recorded(name, "tool", {"tool": tname, "arguments": adigest})
        if recorded is not None:
            self.ctx.record_tool_call(**{**recorded["call"], "replayed": True})
            return str(recorded["text"])
        t = tools[tname]
        try:
            prepared = t.prepare(args, bound)
        except InvalidArguments as exc:
            why = redact(str(exc), [gov.key])
            return self._tool_done(name, base, "invalid", f"error: invalid arguments: {why}",
                                   why)
        except PathNotAllowed as exc:
            self.ctx.record_tool_call(**base, outcome="refused", error=str(exc))
            raise self._refuse(exc) from None
        approved_by = ""
        if tname in approve:
            decision = self.ctx.approval(f"tool:{tname}", {"tool": tname, "arguments": args},
                                         note=f"the agent wants to call {tname}")
            if not decision.approved:
                return self._tool_done(name, {**base, "approved_by": decision.by}, "rejected",
                                       f"error: a person rejected this call "
                                       f"({decision.reason or 'no reason given'})",
                                       decision.reason)
            approved_by = decision.by or "?"
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
            with _observe("tool_call", tname, call_id=str(call.get("id") or "")), \
                    guarded(guard):
                try:
                    value = t.fn(**prepared.kwargs)
                except GovernanceError:
                    pass                    # the guard refused: it is in guard.violations
                except Exception as exc:    # the model reads the error and may try again
                    # never a key it quotes: the text is stored and sent to the model
                    outcome, error = "error", redact(f"{type(exc).__name__}: {exc}",
                                                     [gov.key])
        finally:
            over = ledger.settle(rid, scopes, Amount(tool_calls=1)) if scopes else []
        if guard.violations:
            kind, message = guard.violations[0]
            self.ctx.record_tool_call(**base, approved_by=approved_by, outcome="refused",
                                      error=message)
            exc_type = PathNotAllowed if kind == "path_not_allowed" else ToolNotAllowed
            raise self._refuse(exc_type(message))
        text = redact(result_text(value, max_chars), [gov.key]) if outcome == "ok" \
            else f"error: {error}"
        done = self._tool_done(name, {**base, "approved_by": approved_by}, outcome, text, error)
        if over:
            raise self._over(over)
        return done

    def _tool_done(self, name: str, base: dict[str, Any], outcome: str, text: str,
                   error: str) -> str:
        rec = {"approved_by": "", **base, "outcome": outcome, "result_hash": digest(text),
               "error": error[:2000]}
        self.ctx.record_tool_call(**rec)
        self._record_step(name, {"kind": "tool", "tool": base["tool"],
                                 "arguments": base["arguments_digest"], "text": text,
                                 "call": rec})
        return text


_models: dict[tuple[str, str], ChatModel] = {}


def resolve_model(model: str | ChatModel, key: str | None = None) -> ChatModel:
    """The model object for ``model`` (a provider name is built once per process)."""
    if not isinstance(model, str):
        from . import get_model
        return get_model(model)
    found = _models.get((model, key or ""))
    if found is None:
        from . import get_model
        options: dict[str, Any] = {}
        if key and model.partition(":")[0] == "openai":
            options["key"] = key
        found = _models[(model, key or "")] = get_model(model, options)
    return found


def check_key(key: str | None) -> None:
    """A key alias must name a set environment variable (its value is never read here)."""
    if key is None:
        return
    if not isinstance(key, str) or not key or not key.replace("_", "").isalnum():
        raise ConfigError(f"key={key!r} is not an environment variable name",
                          hint='pass the name of the variable holding the key, e.g. '
                               'key="OPENAI_API_KEY" (never the key itself)')
    if not os.environ.get(key):
        raise ConfigError(f"key alias {key!r}: the environment variable {key} is not set",
                          hint=f"export {key}=... before running (the key is read from it "
                               "when a call is made and is never stored)")


def model_call(prompt: str | Sequence[Mapping[str, Any]], *, model: str | ChatModel,
               system: str | None = None, tools: Sequence[object] = (),
               max_output_tokens: int = 256, temperature: float = 0.0,
               tool_choice: str = "auto", timeout: float | None = None,
               budget: Budget | None = None, run_budget: Budget | None = None,
               key: str | None = None, key_budget: Budget | None = None,
               limits: KeyLimits | None = None, record_content: bool = False,
               retries: int = 2) -> ModelResponse:
    """Call a model once from inside any task: budgeted, rate limited, recorded, replayed.

    This is what ``context().model(...)`` calls. The response's tool calls are
    returned, not run (use :func:`~ledgerflow_agents.agent_task` for a loop).

    Args:
        prompt: the user's text, or a list of chat messages.
        model: a provider name (``"local"``, ``"openai:gpt-4o-mini"``) or a
            model object (``MockModel(turns=[...])``).
        system: a system prompt put first.
        tools: tool schemas to offer (``@tool`` functions).
        max_output_tokens, temperature, tool_choice, timeout: of the request.
        budget, run_budget, key, key_budget, limits, record_content, retries:
            see :class:`Governance`.

    Raises:
        BudgetExceeded: the worst case of the call does not fit a budget.
        ConfigError: ``key`` names an unset environment variable.
        ProviderError: the provider failed for good (RateLimited, ModelTimeout...).

    Example:
        >>> from ledgerflow_agents import MockModel
        >>> model_call("hi", model=MockModel(turns=[{"text": "hello"}])).text
        'hello'
    """
    check_key(key)
    m = resolve_model(model, key)
    alias = key or m.key_alias
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    else:
        messages.extend(dict(p) for p in prompt)
    specs = [as_tool(t).spec() for t in tools]
    request = ModelRequest(messages, tools=specs, max_output_tokens=max_output_tokens,
                           temperature=temperature, tool_choice=tool_choice)
    gov = Governance(budget=budget, run_budget=run_budget, key=alias, key_budget=key_budget,
                     limits=limits, record_content=record_content, timeout=timeout,
                     retries=retries)
    return Session.of().call_model(m, request, gov)
