"""The ``openlineage`` plugin: START, COMPLETE, FAIL and ABORT events per task attempt.

Off until ``LEDGERFLOW_OPENLINEAGE`` names where events go (``file:PATH``,
an ``http(s)://`` URL such as Marquez, or ``1`` for the openlineage
client's own configuration) or :func:`enable` is called; openlineage-python
(about a second to import) is imported only then, or for a backfill.

Events, each emitted after the commit that holds what it reports (from a
thread of their own, so the driver only queues them):

* the pipeline run: ``START`` at its creation, ``COMPLETE`` / ``FAIL`` /
  ``ABORT`` when it ends; job ``PIPELINE``;
* each attempt: ``START`` at its ``running`` commit, its end at the
  attempt's end (``ok`` -> COMPLETE; ``error``, ``timeout``, ``lost`` ->
  FAIL with an ``errorMessage`` facet; ``cancelled`` -> ABORT); job
  ``PIPELINE.NODE``; the pipeline run as the ``parent`` facet; inputs are
  the upstream results and the artifacts it recorded, outputs its result
  and recorded outputs, each with its content hash as the ``version``
  facet; the code version in the ``ledgerflow_code`` job facet; model
  usage (:mod:`ledgerflow_observability.genai`) in ``ledgerflow_modelUsage``;
* a cache hit: START and COMPLETE at that moment (``outcome: cached``), with the
  datasets of the attempt whose result it reuses;
* dataset names by the OpenLineage naming spec (:mod:`ledgerflow_observability._olnames`).

``pipeline lineage RUN_ID --export openlineage FILE`` writes the same
events for a finished run from the ledger (a backfill).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from ledgerflow import hookimpl

from ._settings import openlineage_namespace, openlineage_target
from ._switch import Switch

if TYPE_CHECKING:
    from ledgerflow.records import Record
    from ledgerflow.store import RunStore

    from ._openlineage import Lineage

__all__ = ["FORMAT", "Observer", "disable", "enable", "enabled"]

#: The format name of ``pipeline lineage --export``.
FORMAT = "openlineage"


class Observer:
    """The driver-side hooks, registered while OpenLineage events are on."""

    def __init__(self, target: str | None = None, namespace: str | None = None,
                 client: Any = None) -> None:
        self.target = target or openlineage_target() or "client"
        self.namespace = namespace or openlineage_namespace()
        self.client = client
        self._impl: Lineage | None = None

    def impl(self) -> Lineage:
        """The emitting state (openlineage-python is imported on first use)."""
        if self._impl is None:
            from ._openlineage import Lineage
            self._impl = Lineage(self.target, self.namespace, self.client)
        return self._impl

    @hookimpl
    def ledgerflow_records_committed(self, run_id: str, records: Sequence[Record],
                                     store: RunStore) -> None:
        self.impl().committed(run_id, records, store)

    @hookimpl
    def ledgerflow_run_finish(self, run_id: str) -> None:
        if self._impl is not None:
            self._impl.finish(run_id)

    def close(self) -> None:
        """Emit what is queued and close the client."""
        if self._impl is not None:
            self._impl.close()


SWITCH = Switch("openlineage.observer", Observer)


def enable(target: str | None = None, *, namespace: str | None = None,
           client: Any = None) -> Observer:
    """Emit OpenLineage events for the runs of this process.

    Args:
        target: ``file:PATH``, an ``http(s)://`` URL, or ``client`` (the
            openlineage client's own configuration); default: the setting.
        namespace: of jobs and datasets (default ``LEDGERFLOW_OPENLINEAGE_NAMESPACE``
            or ``ledgerflow``).
        client: an ``OpenLineageClient`` to use instead.
    """
    obs: Observer = SWITCH.enable(target=target, namespace=namespace, client=client)
    return obs


def disable() -> None:
    """Stop emitting (what is queued is emitted first)."""
    SWITCH.disable()


def enabled() -> bool:
    """True while runs of this process emit OpenLineage events."""
    return SWITCH.enabled


@hookimpl
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    if openlineage_target() and not SWITCH.enabled:
        SWITCH.register(pluginmanager)


@hookimpl
def ledgerflow_lineage_formats() -> list[str]:
    return [FORMAT]


@hookimpl
def ledgerflow_export_lineage(format: str, run_id: str, store: RunStore,
                              path: str) -> int | None:
    if format != FORMAT:
        return None
    from ledgerflow.errors import PluginError
    try:
        from ._openlineage import backfill
    except ImportError as exc:
        raise PluginError(f"the OpenLineage export needs openlineage-python ({exc.name} is "
                          "missing)", hint="pip install 'ledgerflow[observability]'") from None
    return backfill(run_id, store, path, openlineage_namespace())
