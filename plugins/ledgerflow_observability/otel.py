"""The ``otel`` plugin: an OpenTelemetry trace per run, a span per task attempt.

Off until ``LEDGERFLOW_OTEL=1`` or a standard ``OTEL_*`` variable turns it
on (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRACES_EXPORTER``; see
:mod:`ledgerflow_observability._settings`), or :func:`enable` is called.
OpenTelemetry is imported only then (:mod:`ledgerflow_observability._otel`
holds everything that touches it).

What it records:

* a root span ``run PIPELINE`` per drive of a run (a resume is a new
  trace, with the same ``ledgerflow.run_id``); run state changes are its
  events;
* a span ``task NAME`` per attempt, from its ``running`` commit to the end
  of the attempt: state changes as span events, ``ledgerflow.outcome``,
  ``ledgerflow.attempt``, ``ledgerflow.fingerprint``,
  ``ledgerflow.cache_hit`` as attributes, errors as an ``exception`` event
  with status ERROR; a cache hit is a span of zero length;
* the attempt's context travels with the job (a
  :class:`~ledgerflow_observability._carrier.TraceCarrier` in ``Job.carrier``)
  and is made current around the task call in whatever process runs it,
  so a span the task opens nests under its attempt; program tasks get it
  as ``TRACEPARENT``; spans a task opens in a ``processes`` worker with the
  global tracer go back to the driver and out through its provider
  (:mod:`ledgerflow_observability._spanfile`), however tracing was turned on;
* model and tool calls reported with :mod:`ledgerflow_observability.genai`
  are child spans with the ``gen_ai.*`` attributes.

Spans go to the tracer provider the user set up (``trace.set_tracer_provider``);
if none is set, one is built from the ``OTEL_*`` variables (OTLP over
HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else
``OTEL_TRACES_EXPORTER``, default ``otlp``) and made global.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from ledgerflow import hookimpl
from ledgerflow.context import context

from . import genai
from ._carrier import TraceCarrier
from ._settings import otel_enabled
from ._switch import Switch

if TYPE_CHECKING:
    from ledgerflow.records import Record
    from ledgerflow.store import RunStore

    from ._otel import Tracing

__all__ = ["Observer", "disable", "enable", "enabled"]


class Observer:
    """The driver-side hooks, registered while tracing is on."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.provider = tracer_provider
        self._impl: Tracing | None = None

    def impl(self) -> Tracing:
        """The tracing state (OpenTelemetry is imported on first use)."""
        if self._impl is None:
            from ._otel import Tracing
            self._impl = Tracing(self.provider)
            self.provider = self._impl.provider
        return self._impl

    @hookimpl
    def ledgerflow_records_committed(self, run_id: str, records: Sequence[Record],
                                     store: RunStore) -> None:
        self.impl().committed(run_id, records, store)

    @hookimpl
    def ledgerflow_job_carrier(self, run_id: str, task_key: str,
                               attempt: int) -> TraceCarrier | None:
        impl = self.impl()
        headers = impl.carrier(run_id, task_key, attempt)
        return None if headers is None else TraceCarrier(headers, os.getpid(), impl.sink)

    @hookimpl
    def ledgerflow_run_finish(self, run_id: str, state: str) -> None:
        if self._impl is not None:
            self._impl.finish(run_id, state)

    def close(self) -> None:
        """End what is still open and flush the spans."""
        if self._impl is not None:
            self._impl.close()


SWITCH = Switch("otel.observer", Observer)


def enable(tracer_provider: Any = None) -> Observer:
    """Trace runs of this process (to ``tracer_provider``, else as configured).

    Example:
        >>> from opentelemetry.sdk.trace import TracerProvider   # doctest: +SKIP
        >>> ledgerflow_observability.otel.enable(TracerProvider())  # doctest: +SKIP
    """
    obs: Observer = SWITCH.enable(tracer_provider=tracer_provider)
    return obs


def disable() -> None:
    """Stop tracing runs of this process (open spans are ended)."""
    SWITCH.disable()


def enabled() -> bool:
    """True while runs of this process are traced."""
    return SWITCH.enabled


# -- always registered: they do nothing unless a run is traced ---------------------------

@hookimpl
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    genai.add_spec(pluginmanager)
    if otel_enabled() and not SWITCH.enabled:
        SWITCH.register(pluginmanager)


@hookimpl
def ledgerflow_genai_call(call: genai.GenAICall
                          ) -> contextlib.AbstractContextManager[None] | None:
    obs = SWITCH.observer
    if obs is None and "traceparent" not in (context().carrier or {}):
        return None          # nothing traced here: no OpenTelemetry import, no span
    from . import _otel
    return _otel.genai_span(call, obs.provider if obs is not None else None)
