"""``@agent_task``: a ledgerflow task whose body is a governed, tool-using model loop.

The decorated function builds the prompt from the task's arguments; its
docstring (or ``system=``) is the system prompt. The loop then asks the
model, dispatches the tool calls it makes (allowlist, path roots, approvals,
budgets and the runtime guard checked at each one), gives it the results,
and stops at the first turn without tool calls: that turn's text is the
task's result::

    @agent_task(model="local", tools=[search_index, save_answer],
                budget=Budget(tokens=20_000, tool_calls=8), approve=["save_answer"])
    def answer(question: str, index: str) -> str:
        \"\"\"Answer from the documents; cite passages as [doc#position].\"\"\"
        return question

Governance is enforced in three places: only the allowed tools' schemas are
sent; providers that can (the local model) constrain decoding to them; and
each call is checked again at dispatch (a tool that is not allowed, or a
path outside a tool's roots, is a notice plus a non-retryable
:class:`~ledgerflow_agents.errors.ToolNotAllowed`). Everything the loop does
is a recorded step (:mod:`ledgerflow_agents.calls`): a retry, a re-run after
an approval or a resume replays it instead of calling again.

What the model can correct goes back to it as an error, at most
``corrections`` times per attempt (each a ``tool_calls`` row with its outcome
and a notice): a refused tool call (not allowed, a path outside the roots,
what the guard stopped), arguments that do not match the schema, a final
answer that does not match ``output=`` (:mod:`ledgerflow_agents.output`), an
unusable answer of a deterministic model. Past that the task fails, not
retried. Agent tasks are not cached across runs unless ``cache=True``.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ledgerflow import task
from ledgerflow.context import context
from ledgerflow.errors import DefinitionError
from ledgerflow.keys import code_version
from ledgerflow.task import Task

from ._canonical import digest
from .budget import Budget
from .calls import Governance, Session, check_key, resolve_model
from .errors import DeterministicFailure, NotAPrompt, OutputInvalid, StepsExceeded
from .limits import KeyLimits
from .output import OutputMismatch, output_schema, parse_output
from .provider import ChatModel, ModelRequest
from .tools import Tool, as_tool

__all__ = ["AgentConfig", "agent_task", "run_agent"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """Everything an agent task was declared with (``task.agent``)."""

    model: ChatModel
    tools: tuple[Tool, ...]
    approve: tuple[str, ...]
    governance: Governance
    max_steps: int
    max_output_tokens: int
    temperature: float
    tool_choice: str
    system: str | None
    max_result_chars: int | None
    cite: str | None = None
    corrections: int = 2
    output: Any = None

    @property
    def tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}


def _budget(name: str, value: object) -> Budget | None:
    if value is None or isinstance(value, Budget):
        return value
    if isinstance(value, Mapping):
        return Budget(**dict(value))
    raise DefinitionError(f"{name}= takes a Budget(...), given: {value!r}",
                          hint=f"e.g. {name}=Budget(tokens=20000)")


def _messages(prompt: object, system: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        out.append({"role": "user", "content": prompt})
    elif isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        out.extend(dict(m) for m in prompt)
    else:
        raise NotAPrompt(f"an agent task's function must return the prompt (a str or a "
                         f"list of messages), returned: {prompt!r:.200}",
                         hint="return the user's text built from the arguments")
    return out


def _correct(session: Session, cfg: AgentConfig, kind: str, why: str) -> bool:
    """Count one correction sent back to the model; False when none is left."""
    if session.corrections >= cfg.corrections:
        return False
    session.corrections += 1
    session.ctx.notice(kind, f"{why} (sent back to the model as an error: correction "
                             f"{session.corrections} of {cfg.corrections})")
    return True


def run_agent(cfg: AgentConfig, bound: Mapping[str, Any], prompt: object) -> Any:
    """The loop: ask, dispatch the tool calls, repeat until a turn has none."""
    session = Session.of(context())
    system = cfg.system
    if cfg.output is not None and cfg.output is not str:
        system = (system + "\n\n" if system else "") + (
            "Give the final answer as JSON only, matching this schema: "
            + output_schema(cfg.output))
    messages = _messages(prompt, system)
    specs = [t.spec() for t in cfg.tools]
    tools = cfg.tool_map
    cited: list[str] = []
    for step in range(cfg.max_steps):
        choice = cfg.tool_choice if step == 0 or cfg.tool_choice == "none" else "auto"
        request = ModelRequest(messages, tools=specs, max_output_tokens=cfg.max_output_tokens,
                               temperature=cfg.temperature,
                               tool_choice=choice if specs else "auto",
                               cite_from=cited)
        try:
            response = session.call_model(cfg.model, request, cfg.governance)
        except DeterministicFailure as exc:
            if not _correct(session, cfg, "malformed_response", str(exc)):
                raise
            # the cause stays in the notice: a small model copies text it is shown
            messages.append({"role": "user", "content": "error: your last answer could not "
                             "be used (it was cut off or is not what was asked for); answer "
                             "again, shorter"})
            continue
        if not response.tool_calls:
            if response.finish_reason == "length":
                session.ctx.notice("answer_cut", f"{cfg.model.provider}/{cfg.model.model}'s "
                                   f"answer reached its length limit (max_output_tokens="
                                   f"{cfg.max_output_tokens}) and was cut: {response.text!r:.200}")
            try:
                return parse_output(response.text, cfg.output)
            except OutputMismatch as exc:
                why = f"the final answer {exc}"
                if not _correct(session, cfg, "output_invalid", why):
                    err = OutputInvalid(f"{why} (after {cfg.corrections} correction(s))")
                    session.ctx.notice(err.kind, str(err))
                    raise err from None
                messages.append({"role": "assistant", "content": response.text})
                messages.append({"role": "user", "content": f"error: your answer {exc}. "
                                 "Answer again with JSON only, matching this schema: "
                                 + output_schema(cfg.output)})
                continue
        messages.append({"role": "assistant", "content": response.text,
                         "tool_calls": [dict(c) for c in response.tool_calls]})
        for call in response.tool_calls:
            text = session.call_tool(tools, call, bound, cfg.approve, cfg.governance,
                                     cfg.max_result_chars, cfg.corrections)
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "name": call["name"], "content": text})
            if cfg.cite:
                cited += [c for c in re.findall(cfg.cite, text) if c not in cited]
    over = StepsExceeded(f"the agent made {cfg.max_steps} model calls without a final answer")
    context().notice(over.kind, str(over))
    raise over


def agent_task(fn: Callable[..., object] | None = None, /, *, model: str | ChatModel,
               tools: Sequence[object] = (), budget: Budget | None = None,
               run_budget: Budget | None = None, key: str | None = None,
               key_budget: Budget | None = None, limits: KeyLimits | None = None,
               approve: Sequence[str] = (), max_steps: int = 8,
               max_output_tokens: int = 256, temperature: float = 0.0,
               tool_choice: str = "auto", system: str | None = None,
               record_content: bool = False, timeout: float | None = None,
               call_retries: int = 2, max_result_chars: int | None = 4000,
               cite: str | None = None, corrections: int = 2, output: Any = None,
               cache: bool = False, retries: int = 2, retry_delay: float = 1.0, name: str | None = None,
               **task_options: Any) -> Any:
    """Make a prompt-building function an agent task (a tool-using model loop).

    Args:
        model: a provider name (``"mock"``, ``"local"``, ``"openai:gpt-4o-mini"``)
            or a model object (``MockModel(turns=[...])``).
        tools: the allowed tools (``@tool`` functions); only their schemas are sent.
        budget: the task's budget (all attempts): tokens, usd, tool_calls, model_calls.
        run_budget: a budget shared by every task of the run that declares it.
        key: the key alias (environment variable name) the calls bill; it must
            be set. Default: the model's own alias.
        key_budget: a budget of the key, shared by every run of the ledger.
        limits: the key's requests/tokens per minute and concurrent calls.
        approve: tools whose calls wait for a person (the approval is bound to
            the tool's name and canonical arguments).
        max_steps: model calls before giving up (StepsExceeded).
        max_output_tokens, temperature: of each model request.
        tool_choice: of the first request (``auto``, ``required``, ``none`` or a
            tool's name); later ones are ``auto``.
        system: the system prompt (default: the function's docstring).
        record_content: keep prompts and responses in the ledger.
        timeout: seconds per model call.
        call_retries: extra tries of a model call after a timeout or a
            malformed answer, within the attempt.
        max_result_chars: longest tool result shown to the model (cut after).
        cite: a regular expression with one group that finds citable ids in tool
            results (e.g. ``r"\\[([^\\]]+#\\d+)\\]"``); once some were found, the
            request asks the final answer to cite one of them
            (``ModelRequest.cite_from``), which providers that constrain
            decoding (``local``) enforce: the answer ends with ``[ID]``.
        corrections: how many mistakes per attempt go back to the model as an
            error it can correct (a refused or invalid tool call, an answer not
            matching ``output``, an unusable answer of a deterministic model);
            past that the task fails without a retry. 0: fail at the first.
        output: the final answer's type (a dataclass, TypedDict, msgspec Struct
            or plain type such as ``int``): the answer is decoded as JSON and
            checked, and the task returns the typed value
            (:mod:`ledgerflow_agents.output`).
        cache: reuse a result from an earlier run with the same inputs. Off by
            default: an agent task asks its model again in every run.
        retries, retry_delay, name, **task_options: of the task (``@task``).

    Raises:
        DefinitionError: an unknown or duplicate tool, ``approve`` naming a
            tool not in ``tools``, a budget that is not positive, a tool
            without type hints, a usd budget for a model without prices.
        ModelNotFoundError: no installed provider has that name.
        ConfigError: ``key`` names an unset environment variable.

    Example:
        >>> from ledgerflow_agents import MockModel
        >>> @agent_task(model=MockModel(turns=[{"text": "4"}]))
        ... def sums(question: str) -> str:
        ...     "Answer with a number."
        ...     return question
        >>> sums("2 + 2?")
        '4'
    """
    budget = _budget("budget", budget)
    run_budget = _budget("run_budget", run_budget)
    key_budget = _budget("key_budget", key_budget)
    if limits is not None and not isinstance(limits, KeyLimits):
        raise DefinitionError(f"limits= takes a KeyLimits(...), given: {limits!r}",
                              hint="e.g. limits=KeyLimits(requests_per_minute=60)")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise DefinitionError(f"max_steps must be a positive whole number, given: "
                              f"{max_steps!r}", hint="e.g. max_steps=8")
    if isinstance(corrections, bool) or not isinstance(corrections, int) or corrections < 0:
        raise DefinitionError(f"corrections must be a whole number >= 0, given: "
                              f"{corrections!r}", hint="e.g. corrections=2")
    schema = output_schema(output) if output is not None and output is not str else None
    if cite is not None:
        try:
            groups = re.compile(cite).groups
        except (re.error, TypeError) as exc:
            raise DefinitionError(f"cite={cite!r} is not a regular expression: {exc}",
                                  hint=r'e.g. cite=r"\[([^\]]+#\d+)\]"') from exc
        if groups != 1:
            raise DefinitionError(f"cite={cite!r} needs exactly one group (the id), "
                                  f"it has {groups}", hint=r'e.g. cite=r"\[([^\]]+#\d+)\]"')
    if isinstance(approve, str):
        approve = [approve]
    check_key(key)
    m = resolve_model(model, key)
    if key and m.key_alias and m.key_alias != key:
        raise DefinitionError(f"key={key!r} but the model bills key {m.key_alias!r}",
                              hint="pass the model's key alias, or leave key= out")
    alias = key or m.key_alias
    check_key(alias)
    ts = [as_tool(t) for t in (tools if not isinstance(tools, (str, bytes)) else [tools])]
    names = [t.name for t in ts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DefinitionError(f"duplicate tool names: {', '.join(dupes)}",
                              hint="give each tool its own name: @tool(name=...)")
    unknown = sorted(set(approve) - set(names))
    if unknown:
        raise DefinitionError(f"approve= names unknown tool(s) {', '.join(unknown)}; the "
                              f"tools are: {', '.join(names) or 'none'}",
                              hint="list the tool in tools=[...] too, or fix the name")
    if tool_choice not in ("auto", "required", "none") and tool_choice not in names:
        raise DefinitionError(f"tool_choice={tool_choice!r} is not auto, required, none or "
                              f"a tool ({', '.join(names) or 'none'})",
                              hint='use tool_choice="required" to make the first step call a '
                                   "tool")
    wants_usd = any(b is not None and b.usd is not None for b in (budget, run_budget,
                                                                  key_budget))
    if wants_usd and m.pricing is None:
        raise DefinitionError(f"a usd budget needs the model's prices, and "
                              f"{m.provider}/{m.model} declares none",
                              hint="give the model pricing=..., or budget tokens instead")
    gov = Governance(budget=budget, run_budget=run_budget, key=alias, key_budget=key_budget,
                     limits=limits, record_content=record_content, timeout=timeout,
                     retries=call_retries)

    def wrap(f: Callable[..., object]) -> Task[..., Any]:
        if isinstance(f, Task) or not callable(f):
            raise DefinitionError(f"@agent_task needs a plain function, given: {f!r}",
                                  hint="decorate the def that builds the prompt")
        sig = inspect.signature(f)
        for t in ts:
            for hidden, p in t.hidden.items():
                if hidden not in sig.parameters and p.default is p.empty:
                    raise DefinitionError(
                        f"tool {t.name!r} takes {hidden!r} from the agent task, but "
                        f"{f.__name__}() has no parameter {hidden!r}",
                        hint=f"add a parameter {hidden} to {f.__name__}()")
        cfg = AgentConfig(model=m, tools=tuple(ts), approve=tuple(approve), governance=gov,
                          max_steps=max_steps, max_output_tokens=max_output_tokens,
                          temperature=temperature, tool_choice=tool_choice,
                          system=system if system is not None else inspect.getdoc(f),
                          max_result_chars=max_result_chars, cite=cite,
                          corrections=corrections, output=output)
        version = task_options.pop("version", None) or digest({
            "fn": code_version(f), "tools": [t.version for t in ts],
            "model": [m.provider, m.model], "approve": sorted(approve),
            "system": cfg.system, "max_steps": max_steps, "tokens": max_output_tokens,
            "temperature": temperature, "tool_choice": tool_choice, "cite": cite,
            "corrections": corrections, "output": schema})[7:23]

        code = getattr(f, "__code__", None)
        where = f"{f.__qualname__}() at {code.co_filename}:{code.co_firstlineno}" \
            if code is not None else f"{f!r}"

        @functools.wraps(f)
        def body(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            prompt = f(*args, **kwargs)
            try:
                return run_agent(cfg, dict(bound.arguments), prompt)
            except NotAPrompt as exc:   # the function is not on the traceback: name it
                raise NotAPrompt(f"{where}: {exc}", hint=exc.hint) from None

        made: Task[..., Any] = task(retries=retries, retry_delay=retry_delay, version=version,
                                    name=name or f.__name__, cache=cache,
                                    # a model's bill and a tool's effect: never unseen twice
                                    **{"side_effects": True, **task_options})(body)
        setattr(made, "agent", cfg)     # noqa: B010 - what the task was declared with
        return made

    return wrap(fn) if fn is not None else wrap
