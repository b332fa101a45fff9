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

Where the parts live: this module has the :class:`Session` (sequence numbers,
replay, model calls) and :func:`model_call`; :mod:`ledgerflow_agents.governance`
what a call is made under (budgets, key, limits, model resolution);
:mod:`ledgerflow_agents.toolcall` the dispatch of one tool call.

Calls of one task should be made one after another: concurrent calls get
sequence numbers in the order they start, which a re-run may not repeat (its
replay then stops at the first difference, which is safe but bills again).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerflow.context import RunContext, context

from . import toolcall
from ._canonical import digest
from .budget import Amount, Budget, BudgetLedger, Owner, Scope, ledger_for
from .errors import (
    BudgetExceeded,
    DeterministicFailure,
    GovernanceError,
    MalformedResponse,
    ModelTimeout,
    ProviderError,
    RateLimited,
)
from .governance import (
    Governance,
    check_key,
    checked,
    cost_of,
    observe,
    resolve_model,
    result_text,
    scrubbed,
)
from .limits import KeyLimiter, KeyLimits, limiter_for
from .provider import ChatModel, ModelRequest, ModelResponse
from .redact import redact
from .tools import Tool, as_tool

__all__ = ["Governance", "Session", "check_key", "model_call", "resolve_model", "result_text"]

_EXT = "ledgerflow_agents"
STEP_PREFIX = "agents:"


@dataclass(slots=True)
class Session:
    """The calls of one attempt of one task: sequence numbers, replay, recording."""

    ctx: RunContext
    durable: bool
    seq: int = 0
    diverged: bool = False
    told_scripted: bool = False
    #: refused calls and bad answers sent back to the model as errors in this attempt
    corrections: int = 0
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
                    raise scrubbed(error, gov)
                self.ctx.notice("rate_limited", f"{model.provider}/{model.model} answered 429"
                                f" (call {seq}); every caller of key {gov.key or '-'} "
                                f"waits {wait:g}s (Retry-After) before trying again")
                if limiter is not None:
                    limiter.block(wait)
                else:
                    time.sleep(wait)
                tries -= 1
                continue
            if isinstance(error, MalformedResponse) and _deterministic(model, request):
                again = DeterministicFailure(
                    f"{model.provider}/{model.model} gave an unusable answer to call {seq} "
                    f"({error}); it answers the same request the same way, so it is not "
                    "retried", usage=error.usage, raw=error.raw)
                self.ctx.notice("deterministic_failure", redact(str(again), [gov.key]))
                raise scrubbed(again, gov) from error
            if error.retryable and tries <= gov.retries:
                continue
            raise scrubbed(error, gov)

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
                with observe("model_call", model.provider, model.model,
                              max_tokens=request.max_output_tokens,
                              temperature=request.temperature) as span:
                    resp = checked(model.complete(request, timeout=gov.timeout))
                    if span is not None:
                        span.usage(resp.usage.input_tokens, resp.usage.output_tokens,
                                   cost_usd=cost_of(model, resp.usage),
                                   finish_reason=resp.finish_reason,
                                   response_model=resp.model)
            except ProviderError as exc:
                usage = exc.usage
                if usage is not None:
                    actual = Amount(usage.total_tokens, cost_of(model, usage), 1, 0)
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
        cost = cost_of(model, resp.usage)
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
                  max_chars: int | None = None, corrections: int = 0) -> str:
        """Dispatch one tool call of the model (:func:`ledgerflow_agents.toolcall.call_tool`).

        Returns the text the model reads next (a result, or why the call did
        not run: a refusal goes back as an error while ``corrections`` are
        left). Raises ToolNotAllowed or PathNotAllowed (after a notice) past them.
        """
        return toolcall.call_tool(self, tools, call, bound, approve, gov, max_chars,
                                  corrections)


def _deterministic(model: ChatModel, request: ModelRequest) -> bool:
    """Whether ``model`` says a retry of ``request`` gives the same answer."""
    check = getattr(model, "deterministic", None)
    return bool(check(request)) if callable(check) else False


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
