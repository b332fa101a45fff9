"""The custom OpenLineage facets of ledgerflow (their JSON schemas ship in ``schemas/``).

Imported only with openlineage-python (see :mod:`ledgerflow_observability._openlineage`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attr
from openlineage.client.facet_v2 import DatasetFacet, JobFacet, RunFacet

import ledgerflow

PRODUCER = f"urn:ledgerflow:{ledgerflow.__version__}"
SCHEMA = "urn:ledgerflow:openlineage:1-0-0:{name}.json#/$defs/{name}"


@attr.define
class LedgerflowTaskRunFacet(RunFacet):
    """Which ledgerflow task attempt an OpenLineage run is."""

    runId: str
    taskKey: str
    attempt: int
    outcome: str | None = attr.field(default=None)
    itemKey: str | None = attr.field(default=None)
    fingerprint: str | None = attr.field(default=None)
    cachedFrom: str | None = attr.field(default=None)
    _additional_skip_redact: ClassVar[list[str]] = ["runId", "taskKey", "attempt"]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowTaskRunFacet")


@attr.define
class LedgerflowRunRunFacet(RunFacet):
    """The ledgerflow run behind an OpenLineage pipeline run."""

    runId: str
    target: str | None = attr.field(default=None)
    state: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowRunRunFacet")


@attr.define
class LedgerflowModelUsageRunFacet(RunFacet):
    """Model calls of one attempt: totals and one entry per provider and model."""

    calls: int
    inputTokens: int
    outputTokens: int
    models: list[dict[str, Any]] = attr.field(factory=list)
    costUsd: float | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowModelUsageRunFacet")


@attr.define
class LedgerflowCodeJobFacet(JobFacet):
    """The task (or pipeline) name and the code version its results depend on."""

    task: str
    codeVersion: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowCodeJobFacet")


@attr.define
class LedgerflowArtifactDatasetFacet(DatasetFacet):
    """What the task said about an artifact it recorded (``record_input(..., **attrs)``)."""

    attrs: dict[str, str]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowArtifactDatasetFacet")


CUSTOM_FACETS = (LedgerflowTaskRunFacet, LedgerflowRunRunFacet, LedgerflowModelUsageRunFacet,
                 LedgerflowCodeJobFacet, LedgerflowArtifactDatasetFacet)

