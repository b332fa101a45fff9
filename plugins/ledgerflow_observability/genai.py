"""Reporting model and tool calls: what an agent loop calls around each one.

The agent loop (or any task) wraps each call::

    from ledgerflow_observability import genai

    with genai.model_call("openai", "gpt-4o-mini", max_tokens=256) as call:
        response = model.complete(request)
        call.usage(response.usage.input_tokens, response.usage.output_tokens,
                   finish_reason=response.finish_reason, cost_usd=0.0004)

    with genai.tool_call("search_index", call_id="call_0_0"):
        hits = search_index(query="patents")

or reports a call that already happened (a replayed one, with its recorded
times) with :func:`report`. What happens then:

* observers implementing ``ledgerflow_genai_call`` (the OpenTelemetry one)
  open a child span of the attempt with the ``gen_ai.*`` attributes
  (``chat gpt-4o-mini``, ``execute_tool search_index``), in the process
  that makes the call;
* a model call adds to the attempt's lineage one ``input`` row per model,
  ``model:PROVIDER/MODEL`` with ``kind=model`` and the sums ``calls``,
  ``input_tokens``, ``output_tokens``, ``cost_usd``: committed with the
  attempt on every executor, so the OpenLineage usage facet and the
  Prometheus token and cost counters see it, live and in a backfill.

Outside a run nothing is recorded. Nothing heavy is imported here; with no
observer on, a call costs a few microseconds.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy

from ledgerflow.context import context

__all__ = ["GenAICall", "model_call", "report", "tool_call"]

log = logging.getLogger("ledgerflow")
hookspec = pluggy.HookspecMarker("ledgerflow")


@dataclass(slots=True, kw_only=True)
class GenAICall:
    """One model or tool call, as observers see it (set usage with :meth:`usage`)."""

    kind: str                      # "model" or "tool"
    operation: str                 # gen_ai.operation.name: chat, embeddings, execute_tool...
    provider: str = ""
    model: str = ""
    tool_name: str = ""
    call_id: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    finish_reasons: tuple[str, ...] = ()
    response_model: str = ""
    response_id: str = ""
    error_type: str = ""
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    run_id: str = ""
    task_key: str = ""
    attempt: int = 0

    def usage(self, input_tokens: int | None, output_tokens: int | None, *,
              cost_usd: float | None = None, finish_reason: str | None = None,
              response_model: str | None = None, response_id: str | None = None) -> None:
        """Record what the call spent and how it finished."""
        self.input_tokens, self.output_tokens = input_tokens, output_tokens
        if cost_usd is not None:
            self.cost_usd = cost_usd
        if finish_reason:
            self.finish_reasons = (finish_reason,)
        if response_model:
            self.response_model = response_model
        if response_id:
            self.response_id = response_id


class GenAISpec:
    """The hook observers implement (added by :mod:`ledgerflow_observability.otel`)."""

    @hookspec
    def ledgerflow_genai_call(self, call: GenAICall
                              ) -> contextlib.AbstractContextManager[None] | None:
        """Return a context manager entered for the duration of ``call``, or None.

        When: around each model or tool call reported with
        :mod:`ledgerflow_observability.genai`; on exit ``call`` holds its
        usage, ``ended_at`` and ``error_type``. Process: the one making the
        call (a worker). Results: each context manager returned is used;
        failures are logged and never reach the caller.
        """


def add_spec(pm: pluggy.PluginManager) -> None:
    """Add ``ledgerflow_genai_call`` to ``pm`` unless it is there."""
    caller = getattr(pm.hook, "ledgerflow_genai_call", None)
    if caller is None or caller.spec is None:
        pm.add_hookspecs(GenAISpec)


def _bind(call: GenAICall) -> GenAICall:
    ctx = context()
    call.run_id, call.task_key, call.attempt = ctx.run_id, ctx.task_key, ctx.attempt
    return call


@contextlib.contextmanager
def model_call(provider: str, model: str, *, operation: str = "chat",
               max_tokens: int | None = None,
               temperature: float | None = None) -> Iterator[GenAICall]:
    """Observe one model call made in the ``with`` body (see the module docstring).

    Example:
        >>> with model_call("mock", "scripted") as call:
        ...     call.usage(12, 3)
        >>> (call.input_tokens, call.output_tokens, call.ended_at is not None)
        (12, 3, True)
    """
    call = _bind(GenAICall(kind="model", operation=operation, provider=provider, model=model,
                           max_tokens=max_tokens, temperature=temperature))
    with _observed(call):
        yield call


@contextlib.contextmanager
def tool_call(name: str, *, call_id: str = "") -> Iterator[GenAICall]:
    """Observe one tool call made in the ``with`` body.

    Example:
        >>> with tool_call("search_index", call_id="call_0") as call:
        ...     pass
        >>> call.operation, call.tool_name
        ('execute_tool', 'search_index')
    """
    call = _bind(GenAICall(kind="tool", operation="execute_tool", tool_name=name,
                           call_id=call_id))
    with _observed(call):
        yield call


def report(call: GenAICall) -> GenAICall:
    """Report a call that already happened (its ``started_at`` / ``ended_at`` set).

    For calls the loop did not wrap, e.g. responses replayed from the ledger.
    """
    _bind(call)
    ended = call.ended_at
    with _observed(call):
        pass
    if ended is not None:
        call.ended_at = ended
    return call


@contextlib.contextmanager
def _observed(call: GenAICall) -> Iterator[None]:
    managers: list[Any] = []
    try:
        from ledgerflow.plugins import get_plugin_manager
        hook = getattr(get_plugin_manager().hook, "ledgerflow_genai_call", None)
        if hook is not None and hook.get_hookimpls():
            managers = [cm for cm in hook(call=call) if cm is not None]
    except Exception:  # observers must never break a call
        log.exception("ledgerflow_genai_call hook failed")
    entered = []
    for cm in managers:
        try:
            cm.__enter__()
            entered.append(cm)
        except Exception:
            log.exception("entering a gen_ai observer failed")
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        call.error_type = call.error_type or type(exc).__qualname__
        raise
    finally:
        if call.ended_at is None:
            call.ended_at = time.time()
        if call.kind == "model":
            _record_usage(call)
        for cm in reversed(entered):
            try:
                if error is None:
                    cm.__exit__(None, None, None)
                else:
                    cm.__exit__(type(error), error, error.__traceback__)
            except Exception:
                log.exception("leaving a gen_ai observer failed")


def _record_usage(call: GenAICall) -> None:
    """Add the call to its attempt's ``model:`` lineage row (sums per model)."""
    ctx = context()
    if ctx.run_id == "local":
        return
    uri = f"model:{call.provider}/{call.model}"
    attrs: dict[str, str] | None = None
    for direction, u, _, a in ctx.lineage:
        if u == uri and direction == "input" and a.get("kind") == "model":
            attrs = a
            break
    if attrs is None:
        attrs = {"kind": "model", "provider": call.provider, "model": call.model,
                 "calls": "0", "input_tokens": "0", "output_tokens": "0"}
        ctx.lineage.append(("input", uri, None, attrs))
    attrs["calls"] = str(int(attrs["calls"]) + 1)
    attrs["input_tokens"] = str(int(attrs["input_tokens"]) + (call.input_tokens or 0))
    attrs["output_tokens"] = str(int(attrs["output_tokens"]) + (call.output_tokens or 0))
    if call.cost_usd is not None:
        attrs["cost_usd"] = repr(float(attrs.get("cost_usd", "0")) + call.cost_usd)
    if call.error_type:
        attrs["errors"] = str(int(attrs.get("errors", "0")) + 1)


def usage_rows(artifacts: Any) -> list[dict[str, str]]:
    """The ``kind=model`` attrs among an attempt's artifacts ``(direction, uri, hash, attrs)``."""
    return [dict(a) for _, _, _, a in artifacts if a.get("kind") == "model"]
