"""Spans opened in worker processes, shipped to the driver as JSON lines.

The driver's tracer provider lives in the driver (it may be one the user
built in Python, with an in-memory or custom exporter), so a ``processes``
worker cannot export to it. Instead the worker's global tracer provider
(:func:`worker_provider`, installed when the worker runs its first traced
attempt) writes every span that ends during an attempt to a file of that
attempt in the driver's sink folder (``<sink>/<attempt span id>.jsonl``,
a private temporary folder); the driver reads it when the attempt ends
(:meth:`Sink.adopt`) and hands the spans to its own span processors, so they
are exported with the driver's resource, wherever the driver's spans go.
Imported only when tracing is on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

log = logging.getLogger("ledgerflow")

_lock = threading.Lock()
#: The file the spans of the attempt running in this worker go to (None: between attempts).
_current: str | None = None


def path_of(sink: str, span_id: int) -> str:
    """The file of the attempt whose span is ``span_id``."""
    return os.path.join(sink, f"{span_id:016x}.jsonl")


def _context(trace_id: str, span_id: str, flags: int, remote: bool) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=remote,
                       trace_flags=TraceFlags(flags))


def _attrs(attrs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in dict(attrs or {}).items():
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def to_dict(span: ReadableSpan) -> dict[str, Any]:
    """One span as JSON-ready data."""
    ctx = span.get_span_context()
    assert ctx is not None
    scope = span.instrumentation_scope
    return {
        "name": span.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
        "flags": int(ctx.trace_flags),
        "parent": None if span.parent is None else [f"{span.parent.trace_id:032x}",
                                                    f"{span.parent.span_id:016x}",
                                                    int(span.parent.trace_flags)],
        "kind": span.kind.name, "start": span.start_time, "end": span.end_time,
        "attributes": _attrs(span.attributes),
        "events": [[e.name, e.timestamp, _attrs(e.attributes)] for e in span.events],
        "links": [[f"{lk.context.trace_id:032x}", f"{lk.context.span_id:016x}",
                   int(lk.context.trace_flags), _attrs(lk.attributes)] for lk in span.links],
        "status": [span.status.status_code.name, span.status.description],
        "scope": None if scope is None else [scope.name, scope.version, scope.schema_url],
    }


def from_dict(d: dict[str, Any], resource: Any) -> ReadableSpan:
    """The span :func:`to_dict` wrote, with the driver's ``resource``."""
    parent = d["parent"]
    scope = d["scope"]
    code, description = d["status"]
    return ReadableSpan(
        name=d["name"], context=_context(d["trace_id"], d["span_id"], d["flags"], False),
        parent=None if parent is None else _context(parent[0], parent[1], parent[2], True),
        resource=resource, attributes=d["attributes"],
        events=[Event(name, attrs, timestamp=ts) for name, ts, attrs in d["events"]],
        links=[Link(_context(t, s, f, True), attrs) for t, s, f, attrs in d["links"]],
        kind=SpanKind[d["kind"]],
        status=Status(StatusCode[code], description) if code != "UNSET" else Status(),
        start_time=d["start"], end_time=d["end"],
        instrumentation_scope=None if scope is None else InstrumentationScope(*scope))


class _ToFile(SpanExporter):
    """Appends each span to the current attempt's file (spans ending between attempts are
    dropped: nobody would read them)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with _lock:
            path = _current
            if path is None:
                return SpanExportResult.SUCCESS
            try:
                with open(path, "a", encoding="utf-8") as fh:
                    for span in spans:
                        fh.write(json.dumps(to_dict(span), default=str) + "\n")
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


def worker_provider() -> TracerProvider:
    """The tracer provider of a worker process whose spans go back to the driver."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_ToFile()))
    return provider


def start(sink: str, span_id: int) -> None:
    """Spans that end from now on belong to the attempt ``span_id``."""
    global _current
    with _lock:
        _current = path_of(sink, span_id)


def stop() -> None:
    """The attempt ended: later spans are dropped."""
    global _current
    with _lock:
        _current = None


class Sink:
    """The driver's private folder of worker spans, probed cheaply at each attempt's end.

    Most attempts run where no worker writes (threads, inline): the folder is
    listed again only when its mtime changed, or when the last listing was
    less than 50 ms after that mtime (a file made in the same clock tick would
    not have changed it); otherwise an attempt's end costs one ``stat``.
    """

    _SETTLED_NS = 50_000_000

    def __init__(self) -> None:
        import tempfile
        self.path = tempfile.mkdtemp(prefix="ledgerflow-spans-")
        self._mtime = -1
        self._listed = 0
        self._names: set[str] = set()

    def _has(self, name: str) -> bool:
        if name in self._names:
            return True
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return False
        if mtime == self._mtime and self._listed - mtime > self._SETTLED_NS:
            return False
        self._mtime, self._listed = mtime, time.time_ns()
        self._names = set(os.listdir(self.path))
        return name in self._names

    def adopt(self, provider: Any, span_id: int) -> int:
        """Hand the spans a worker wrote for the attempt ``span_id`` to ``provider``'s span
        processors (an SDK provider; others are skipped); return how many."""
        name = f"{span_id:016x}.jsonl"
        if not self._has(name):
            return 0
        self._names.discard(name)
        path = os.path.join(self.path, name)
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            os.unlink(path)
        except FileNotFoundError:
            return 0
        processor = getattr(provider, "_active_span_processor", None)
        resource = getattr(provider, "resource", None)
        if processor is None:
            return 0
        n = 0
        for line in lines:
            try:
                processor.on_end(from_dict(json.loads(line), resource))
                n += 1
            except Exception:      # a torn line (the worker was killed mid-write)
                log.debug("a worker span could not be read back", exc_info=True)
        return n
