"""Fixtures for the observability tests: each observer on for one test, then off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def spans() -> Iterator[Any]:
    """Tracing on, into an in-memory exporter (returned)."""
    pytest.importorskip("opentelemetry.sdk", reason="needs the 'observability' extra")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ledgerflow_observability import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.enable(provider)
    try:
        yield exporter
    finally:
        otel.disable()
        provider.shutdown()
