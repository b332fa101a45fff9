"""The ``dask`` executor plugin: run ledgerflow tasks on a Dask cluster.

Registered as ``dask = "ledgerflow_dask"`` in the ``ledgerflow`` entry-point
group; needs ``pip install 'ledgerflow[dask]'``. See ``README.md`` here.
"""

from __future__ import annotations

from ledgerflow import hookimpl
from ledgerflow.config import Settings

from .executor import DaskExecutor

__all__ = ["DaskExecutor"]


@hookimpl
def ledgerflow_executor_names() -> list[str]:
    return ["dask"]


@hookimpl
def ledgerflow_make_executor(name: str, settings: Settings) -> DaskExecutor | None:
    if name != "dask":
        return None
    ex = DaskExecutor.from_settings(settings)
    if ex.address:      # fail before the run is recorded if the scheduler is unreachable
        ex.connect(settings.workers)
    return ex
