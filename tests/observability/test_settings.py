"""Which observer a setting turns on (the environment is read, nothing imported)."""

from __future__ import annotations

from ledgerflow_observability._settings import (
    openlineage_namespace,
    openlineage_target,
    otel_enabled,
    prometheus_interval,
    prometheus_target,
)


def test_otel_is_off_unless_asked_for() -> None:
    assert not otel_enabled({})
    assert otel_enabled({"LEDGERFLOW_OTEL": "1"})
    assert otel_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert otel_enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318"})
    assert otel_enabled({"OTEL_TRACES_EXPORTER": "console"})
    assert not otel_enabled({"OTEL_TRACES_EXPORTER": "none"})
    assert not otel_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "OTEL_SDK_DISABLED": "true"})
    assert not otel_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "LEDGERFLOW_OTEL": "0"})
    assert otel_enabled({"OTEL_SDK_DISABLED": "true", "LEDGERFLOW_OTEL": "1"})


def test_openlineage_and_prometheus_targets() -> None:
    assert openlineage_target({}) is None
    assert openlineage_target({"LEDGERFLOW_OPENLINEAGE": "0"}) is None
    assert openlineage_target({"LEDGERFLOW_OPENLINEAGE": "1"}) == "client"
    assert openlineage_target({"LEDGERFLOW_OPENLINEAGE": "file:/tmp/e.jsonl"}) == \
        "file:/tmp/e.jsonl"
    assert openlineage_namespace({}) == "ledgerflow"
    assert openlineage_namespace({"OPENLINEAGE_NAMESPACE": "x"}) == "x"
    assert openlineage_namespace({"LEDGERFLOW_OPENLINEAGE_NAMESPACE": "y",
                                  "OPENLINEAGE_NAMESPACE": "x"}) == "y"
    assert prometheus_target({}) is None
    assert prometheus_target({"LEDGERFLOW_PROMETHEUS": "yes"}) == "ledger"
    assert prometheus_target({"LEDGERFLOW_PROMETHEUS": "/var/lib/ne"}) == "/var/lib/ne"
    assert prometheus_interval({"LEDGERFLOW_PROMETHEUS_INTERVAL": "2.5"}) == 2.5
    assert prometheus_interval({"LEDGERFLOW_PROMETHEUS_INTERVAL": "x"}) == 10.0
