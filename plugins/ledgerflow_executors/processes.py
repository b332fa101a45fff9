"""The ``processes`` executor's plugin: its name, and the executor made on first use.

The executor itself (:mod:`ledgerflow_executors.process_pool`) imports
``multiprocessing`` and the program supervisor, which every ``pipeline``
command would otherwise pay for (~10 ms) at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerflow import hookimpl
from ledgerflow.config import Settings

if TYPE_CHECKING:
    from .process_pool import ProcessExecutor


@hookimpl
def ledgerflow_executor_names() -> list[str]:
    return ["processes"]


@hookimpl
def ledgerflow_make_executor(name: str, settings: Settings) -> ProcessExecutor | None:
    if name != "processes":
        return None
    from .process_pool import ProcessExecutor
    return ProcessExecutor.from_settings(settings)
