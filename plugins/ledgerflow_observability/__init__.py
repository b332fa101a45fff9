"""Observability plugins: OpenTelemetry traces, OpenLineage events, Prometheus metrics.

Three observers, each its own entry point in the ``ledgerflow`` group
(``otel``, ``openlineage``, ``prometheus``) and each **off** until its
setting turns it on (see :mod:`ledgerflow_observability._settings` and
``README.md`` here). Their libraries (``pip install 'ledgerflow[observability]'``)
are imported only when the observer is on, so ``import ledgerflow`` and
runs without observers pay nothing. :mod:`ledgerflow_observability.genai` is
what an agent loop calls around each model and tool call.

All three read what the ledger committed (``ledgerflow_records_committed``):
they never report a transition a crash could still lose.
"""

from __future__ import annotations
