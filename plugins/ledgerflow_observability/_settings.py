"""The observers' settings: which are on, read from the environment (stdlib only).

Every observer is off unless its setting turns it on; nothing here imports
an observability library.

=============================  ==============================================
``LEDGERFLOW_OTEL``            ``1`` on, ``0`` off (wins over ``OTEL_*``)
``OTEL_EXPORTER_OTLP_ENDPOINT``  on, OTLP to that endpoint (also ``..._TRACES_ENDPOINT``)
``OTEL_TRACES_EXPORTER``       on with that exporter (``otlp``, ``console``...); ``none`` off
``OTEL_SDK_DISABLED``          ``true``: off
``LEDGERFLOW_OPENLINEAGE``     ``file:PATH`` (append one event per line), an
                               ``http(s)://`` URL (e.g. Marquez), or ``1`` (the
                               openlineage client's own configuration:
                               ``openlineage.yml``, ``OPENLINEAGE_URL``...)
``LEDGERFLOW_OPENLINEAGE_NAMESPACE``  job and dataset namespace (default ``ledgerflow``)
``LEDGERFLOW_PROMETHEUS``      ``1``: a textfile beside the ledger
                               (``<ledger>.d/metrics.prom``); a path: that file
                               (a directory: ``ledgerflow.prom`` in it)
``LEDGERFLOW_PROMETHEUS_INTERVAL``  seconds between textfile writes during a run (10)
=============================  ==============================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

OFF: Final = frozenset({"", "0", "false", "no", "off", "none"})
ON: Final = frozenset({"1", "true", "yes", "on"})


def _flag(raw: str | None) -> bool | None:
    """True / False for a recognised on/off word, None when unset or another value."""
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    return None


def otel_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """True if OpenTelemetry tracing is asked for (see the module docstring)."""
    own = _flag(env.get("LEDGERFLOW_OTEL"))
    if own is not None:
        return own
    if _flag(env.get("OTEL_SDK_DISABLED")):
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def openlineage_target(env: Mapping[str, str] = os.environ) -> str | None:
    """Where OpenLineage events go: ``file:PATH``, a URL, ``client``, or None (off)."""
    raw = env.get("LEDGERFLOW_OPENLINEAGE", "").strip()
    flag = _flag(raw)
    if flag is False or not raw:
        return None
    if flag is True:
        return "client"
    return raw


def openlineage_namespace(env: Mapping[str, str] = os.environ) -> str:
    """The namespace of jobs and of the ledger's datasets."""
    return (env.get("LEDGERFLOW_OPENLINEAGE_NAMESPACE") or env.get("OPENLINEAGE_NAMESPACE")
            or "ledgerflow")


def prometheus_target(env: Mapping[str, str] = os.environ) -> str | None:
    """``ledger`` (a file beside the ledger), a path, or None (off)."""
    raw = env.get("LEDGERFLOW_PROMETHEUS", "").strip()
    flag = _flag(raw)
    if flag is False or not raw:
        return None
    return "ledger" if flag is True else raw


def prometheus_interval(env: Mapping[str, str] = os.environ) -> float:
    """Seconds between textfile writes while a run goes on (at least 0.1)."""
    try:
        return max(0.1, float(env.get("LEDGERFLOW_PROMETHEUS_INTERVAL", "10")))
    except ValueError:
        return 10.0
