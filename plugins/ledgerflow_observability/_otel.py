"""Everything that touches OpenTelemetry: the tracer provider, run and attempt spans.

Imported only when tracing is on (see :mod:`ledgerflow_observability.otel`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import ProxyTracerProvider, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import ledgerflow
from ledgerflow.records import Notice, Record, RunDefined, RunStateChanged, Transition
from ledgerflow.store import RunStore
from ledgerflow.views import TaskRow

from ._runs import TRACKERS, Ended, RunTracker
from ._settings import otel_enabled
from .genai import GenAICall

log = logging.getLogger("ledgerflow")

PROPAGATOR = TraceContextTextMapPropagator()
SCOPE = "ledgerflow"
_TERMINAL_RUN = frozenset({"succeeded", "failed", "cancelled"})
_ERROR_OUTCOMES = frozenset({"error", "timeout", "lost"})

#: gen_ai semantic-convention attribute names (opentelemetry-semantic-conventions
#: ``gen_ai_attributes``; a test checks they match).
GEN_AI = {
    "operation": "gen_ai.operation.name",
    "provider": "gen_ai.provider.name",
    "request_model": "gen_ai.request.model",
    "max_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "response_model": "gen_ai.response.model",
    "response_id": "gen_ai.response.id",
    "finish_reasons": "gen_ai.response.finish_reasons",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "tool_name": "gen_ai.tool.name",
    "tool_call_id": "gen_ai.tool.call.id",
    "tool_type": "gen_ai.tool.type",
    "error_type": "error.type",
}

_provider_lock = threading.Lock()
#: The provider this module built for a worker process (flushed after each attempt).
_worker_provider: Any = None
#: True when that provider ships spans back to the driver (:mod:`._spanfile`).
_ships = False


def _ns(ts: float | None) -> int | None:
    return None if ts is None else int(ts * 1e9)


# -- the tracer provider ----------------------------------------------------------------

def provider_from_env() -> Any:
    """A tracer provider configured by the ``OTEL_*`` variables (not made global)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attrs: dict[str, Any] = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        attrs["service.name"] = "ledgerflow"
    provider = TracerProvider(resource=Resource.create(attrs))
    for exporter in _exporters():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporters() -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default)."""
    from importlib.metadata import entry_points

    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
             if n.strip() and n.strip() != "none"]
    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    out = []
    for name in names:
        if name == "otlp" and "otlp" not in found:
            proto = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                     or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
            name = "otlp_proto_grpc" if proto == "grpc" else "otlp_proto_http"
        ep = found.get(name)
        if ep is None:
            log.warning("OpenTelemetry span exporter %r is not installed; installed: %s",
                        name, ", ".join(sorted(found)) or "none")
            continue
        out.append(ep.load()())
    return out


def global_provider(configure: bool) -> tuple[Any, bool]:
    """The global tracer provider; with ``configure``, build one from the environment
    if none is set. Returns (provider, built here)."""
    with _provider_lock:
        current = trace.get_tracer_provider()
        if not isinstance(current, ProxyTracerProvider) or not configure:
            return current, False
        provider = provider_from_env()
        trace.set_tracer_provider(provider)
        return provider, True


# -- in the process that runs an attempt -------------------------------------------------

@contextlib.contextmanager
def attached(carrier: Mapping[str, str], origin: int = 0,
             sink: str | None = None) -> Iterator[None]:
    """Make the attempt's span context current around the task call.

    In a worker process (``origin``, the driver's pid, is another process)
    with no tracer provider of its own, spans the task opens with the global
    tracer go back to the driver through ``sink`` (:mod:`._spanfile`), however
    the driver's tracing was turned on; where the sink folder is not reachable
    (another machine), to a provider built from the ``OTEL_*`` variables, if set.
    """
    global _worker_provider, _ships
    remote = origin not in (0, os.getpid())
    if _worker_provider is None:
        if remote and sink and os.path.isdir(sink):
            _worker_provider, _ships = _shipping_provider()
        elif otel_enabled():
            provider, built = global_provider(configure=True)
            if built:       # a worker process: its spans are flushed after each attempt
                _worker_provider = provider
    shipping = _ships and sink is not None
    if shipping:
        from . import _spanfile
        _spanfile.start(str(sink), _span_id(carrier))
    token = otel_context.attach(PROPAGATOR.extract(dict(carrier)))
    try:
        yield
    finally:
        otel_context.detach(token)
        if shipping:
            _spanfile.stop()
        elif _worker_provider is not None:
            _worker_provider.force_flush(1000)     # bounded: a collector that is down


def _shipping_provider() -> tuple[Any, bool]:
    """Install the global provider whose spans go to the driver (unless the task's process
    has one already); returns (provider, whether it ships)."""
    from ._spanfile import worker_provider
    with _provider_lock:
        current = trace.get_tracer_provider()
        if not isinstance(current, ProxyTracerProvider):
            return current, False
        provider = worker_provider()
        trace.set_tracer_provider(provider)
        return provider, True


def _span_id(carrier: Mapping[str, str]) -> int:
    """The span id in a ``traceparent`` header (``00-TRACE-SPAN-FLAGS``)."""
    try:
        return int(carrier["traceparent"].split("-")[2], 16)
    except (KeyError, IndexError, ValueError):
        return 0


@contextlib.contextmanager
def genai_span(call: GenAICall, provider: Any = None) -> Iterator[None]:
    """A ``gen_ai`` span for one model or tool call, child of the current span."""
    tracer = (provider or trace.get_tracer_provider()).get_tracer(
        "ledgerflow.genai", ledgerflow.__version__)
    if call.kind == "tool":
        name = f"execute_tool {call.tool_name}"
        attrs: dict[str, Any] = {GEN_AI["operation"]: call.operation,
                                 GEN_AI["tool_name"]: call.tool_name,
                                 GEN_AI["tool_type"]: "function"}
        if call.call_id:
            attrs[GEN_AI["tool_call_id"]] = call.call_id
        kind = SpanKind.INTERNAL
    else:
        name = f"{call.operation} {call.model}".strip()
        attrs = {GEN_AI["operation"]: call.operation, GEN_AI["provider"]: call.provider,
                 GEN_AI["request_model"]: call.model}
        if call.max_tokens is not None:
            attrs[GEN_AI["max_tokens"]] = call.max_tokens
        if call.temperature is not None:
            attrs[GEN_AI["temperature"]] = call.temperature
        kind = SpanKind.CLIENT
    if call.run_id and call.run_id != "local":
        attrs.update({"ledgerflow.run_id": call.run_id, "ledgerflow.task_key": call.task_key,
                      "ledgerflow.attempt": call.attempt})
    span = tracer.start_span(name, kind=kind, attributes=attrs,
                             start_time=_ns(call.started_at))
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            yield
    finally:
        if call.kind == "model":
            done: dict[str, Any] = {}
            if call.input_tokens is not None:
                done[GEN_AI["input_tokens"]] = call.input_tokens
            if call.output_tokens is not None:
                done[GEN_AI["output_tokens"]] = call.output_tokens
            if call.finish_reasons:
                done[GEN_AI["finish_reasons"]] = list(call.finish_reasons)
            if call.response_model:
                done[GEN_AI["response_model"]] = call.response_model
            if call.response_id:
                done[GEN_AI["response_id"]] = call.response_id
            if call.cost_usd is not None:
                done["ledgerflow.cost_usd"] = call.cost_usd
            span.set_attributes(done)
        if call.error_type:
            span.set_attribute(GEN_AI["error_type"], call.error_type)
            span.set_status(Status(StatusCode.ERROR, call.error_type))
        span.end(end_time=_ns(call.ended_at))


# -- in the driver -----------------------------------------------------------------------

@dataclass(slots=True)
class _Run:
    tracker: RunTracker
    root: Span | None = None
    root_ctx: Any = None
    open: dict[tuple[str, int], Span] = field(default_factory=dict)


class Tracing:
    """Spans of the runs this process drives, made from their committed records."""

    def __init__(self, provider: Any = None) -> None:
        if provider is None:
            provider, _ = global_provider(configure=True)
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE, ledgerflow.__version__)
        self.runs: dict[str, _Run] = {}
        self._sink: Any = None          # a _spanfile.Sink, made on first use

    @property
    def sink(self) -> str:
        """The private folder workers write their spans to (made on first use)."""
        if self._sink is None:
            import atexit
            import shutil

            from ._spanfile import Sink
            self._sink = Sink()
            atexit.register(shutil.rmtree, self._sink.path, True)   # also if never closed
        return str(self._sink.path)

    def committed(self, run_id: str, records: Sequence[Record], store: RunStore) -> None:
        """Turn one commit's records into span starts, events and ends."""
        commit = TRACKERS.commit(self, run_id, records, store)
        tracker, ended = commit.tracker, commit.ended
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = _Run(tracker)
        if run.root is None:
            self._start_root(run, records)
        opened = run.open
        for rec in records:
            if isinstance(rec, Transition):
                if rec.to_state == "running":
                    self._start_attempt(run, tracker.tasks[rec.task_key], rec.attempt, rec.ts)
                    continue
                span = opened.get((rec.task_key, rec.attempt))
                if span is not None and rec.to_state != "ready":   # ready: the next attempt
                    span.add_event(rec.to_state, {"ledgerflow.from_state": rec.from_state or "",
                                                  "ledgerflow.reason": rec.reason},
                                   timestamp=_ns(rec.ts))
                elif rec.to_state == "succeeded" and rec.from_state == "ready":
                    self._cache_hit(run, tracker.tasks[rec.task_key], rec)
            elif isinstance(rec, RunStateChanged):
                assert run.root is not None
                run.root.add_event(f"run {rec.state}", {"ledgerflow.reason": rec.reason},
                                   timestamp=_ns(rec.at))
            elif isinstance(rec, Notice):
                target = opened.get((rec.task_key or "", rec.attempt or 0)) or run.root
                assert target is not None
                target.add_event("ledgerflow.notice",
                                 {"ledgerflow.notice.kind": rec.kind,
                                  "ledgerflow.task_key": rec.task_key or "",
                                  "ledgerflow.attempt": rec.attempt or 0,
                                  "ledgerflow.notice.message": rec.message},
                                 timestamp=_ns(rec.ts))
        for end in ended:
            self._end_attempt(run, end)
        final = [r for r in records if isinstance(r, RunStateChanged)
                 and r.state in _TERMINAL_RUN]
        if final:
            last = final[-1]
            self._end_root(run, last.state, last.reason, last.at)

    def _start_root(self, run: _Run, records: Sequence[Record]) -> None:
        tracker = run.tracker
        start = next((r.at for r in records if isinstance(r, RunStateChanged)),
                     tracker.created_at or None)
        resumed = not any(type(r) is RunDefined for r in records)
        root = self.tracer.start_span(
            f"run {tracker.pipeline}", context=otel_context.Context(), kind=SpanKind.INTERNAL,
            start_time=_ns(start),
            attributes={"ledgerflow.run_id": tracker.run_id,
                        "ledgerflow.pipeline": tracker.pipeline,
                        "ledgerflow.resumed": resumed})
        run.root = root
        run.root_ctx = trace.set_span_in_context(root)

    def _attrs(self, run: _Run, info: TaskRow, attempt: int) -> dict[str, Any]:
        attrs: dict[str, Any] = {"ledgerflow.run_id": run.tracker.run_id,
                                 "ledgerflow.pipeline": run.tracker.pipeline,
                                 "ledgerflow.task_key": info.key,
                                 "ledgerflow.task_name": info.task_name,
                                 "ledgerflow.attempt": attempt,
                                 "ledgerflow.code_version": info.code_version}
        if info.item_key is not None:
            attrs["ledgerflow.item_key"] = info.item_key
        return attrs

    def _start_attempt(self, run: _Run, info: TaskRow, attempt: int, ts: float) -> Span:
        span: Span = self.tracer.start_span(f"task {info.task_name}", context=run.root_ctx,
                                      kind=SpanKind.INTERNAL, start_time=_ns(ts),
                                      attributes=self._attrs(run, info, attempt))
        span.add_event("running", {"ledgerflow.reason": f"attempt {attempt}"},
                       timestamp=_ns(ts))
        run.open[(info.key, attempt)] = span
        return span

    def _cache_hit(self, run: _Run, info: TaskRow, e: Transition) -> None:
        attrs = self._attrs(run, info, e.attempt)
        attrs.update({"ledgerflow.outcome": "cached", "ledgerflow.cache_hit": True,
                      "ledgerflow.cached_from": info.cached_from or "",
                      "ledgerflow.content_hash": info.result_hash or ""})
        if info.fingerprint:
            attrs["ledgerflow.fingerprint"] = info.fingerprint
        span = self.tracer.start_span(f"task {info.task_name}", context=run.root_ctx,
                                      kind=SpanKind.INTERNAL, start_time=_ns(e.ts),
                                      attributes=attrs)
        span.add_event("succeeded", {"ledgerflow.from_state": "ready",
                                     "ledgerflow.reason": e.reason}, timestamp=_ns(e.ts))
        span.end(end_time=_ns(e.ts))

    def _end_attempt(self, run: _Run, end: Ended) -> None:
        key = (end.task.key, end.attempt)
        span = run.open.pop(key, None)
        if span is None:        # e.g. a lost attempt of an earlier drive, recorded now
            span = self._start_attempt(run, end.task, end.attempt,
                                       end.running_at or end.started_at or end.ended_at)
            run.open.pop(key, None)
        attrs: dict[str, Any] = {"ledgerflow.outcome": end.outcome,
                                 "ledgerflow.cache_hit": False}
        if end.fingerprint:
            attrs["ledgerflow.fingerprint"] = end.fingerprint
        if end.result_hash:
            attrs["ledgerflow.content_hash"] = end.result_hash
        if end.started_at:
            span.add_event("started", {}, timestamp=_ns(end.started_at))
        if self._sink is not None:      # what the task opened in a worker process
            self._sink.adopt(self.provider, span.get_span_context().span_id)
        span.set_attributes(attrs)
        if end.outcome != "ok":
            span.set_attribute("error.type", end.error_type or end.outcome)
            exc: dict[str, Any] = {"exception.type": end.error_type or end.outcome,
                                   "exception.message": end.error_message}
            if end.traceback:
                exc["exception.stacktrace"] = end.traceback
            span.add_event("exception", exc, timestamp=_ns(end.ended_at))
            if end.outcome in _ERROR_OUTCOMES:
                desc = f"{end.error_type}: {end.error_message}" if end.error_type \
                    else f"{end.outcome}: {end.error_message}"
                span.set_status(Status(StatusCode.ERROR, desc.strip(": ")))
        span.end(end_time=_ns(end.ended_at))

    def _end_root(self, run: _Run, state: str, reason: str = "",
                  at: float | None = None) -> None:
        for span in run.open.values():      # attempts left open (cancel not confirmed...)
            span.set_status(Status(StatusCode.ERROR, f"run ended {state} while it ran"))
            span.end(end_time=_ns(at))
        run.open.clear()
        if run.root is not None:
            run.root.set_attribute("ledgerflow.state", state)
            if state in ("failed", "interrupted"):
                run.root.set_status(Status(StatusCode.ERROR, reason or f"run {state}"))
            run.root.end(end_time=_ns(at))
            run.root = None

    def carrier(self, run_id: str, task_key: str, attempt: int) -> dict[str, str] | None:
        """``{"traceparent": ...}`` of the attempt's span, for the job."""
        run = self.runs.get(run_id)
        span = run.open.get((task_key, attempt)) if run is not None else None
        if span is None:
            return None
        out: dict[str, str] = {}
        PROPAGATOR.inject(out, context=trace.set_span_in_context(span))
        return out

    def finish(self, run_id: str, state: str) -> None:
        """The run stopped driving: end its spans (``interrupted``: with an error)."""
        run = self.runs.pop(run_id, None)
        TRACKERS.finish(self, run_id)
        if run is not None and (run.root is not None or run.open):
            self._end_root(run, state, "the driver stopped" if state == "interrupted" else "")

    def close(self) -> None:
        """End every open span and flush the provider."""
        for run_id in list(self.runs):
            self.finish(run_id, "interrupted")
        flush = getattr(self.provider, "force_flush", None)
        if callable(flush):
            flush(5000)
        if self._sink is not None:
            import shutil
            shutil.rmtree(self._sink.path, ignore_errors=True)
            self._sink = None
