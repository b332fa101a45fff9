"""ledgerflow: durable, resumable pipelines of plain Python functions.

Example:
    >>> from ledgerflow import task, pipeline
    >>> @task
    ... def add(a: int, b: int) -> int:
    ...     return a + b
    >>> add(1, 2)
    3
"""

from __future__ import annotations

import typing as _typing

from .approval import Approval
from .context import RunContext, TaskCancelled, TaskTimedOut, context
from .control import (
    Run,
    approvals,
    approve,
    cancel,
    get_run,
    plan_resume,
    reject,
    resume,
    run,
    runs,
)
from .errors import (
    CycleError,
    DefinitionError,
    InputError,
    NonRetryableError,
    NotResumableError,
    PipelineError,
    RunFailedError,
    RunNotFoundError,
    StoreError,
    TaskFailedError,
)
from .hookspecs import hookimpl
from .pipeline import Pipeline, pipeline
from .task import Task, task

if _typing.TYPE_CHECKING:
    from .programs import Limits as Limits
    from .programs import program as program

#: Exported on first use (from :mod:`ledgerflow.programs`), so ``import ledgerflow`` stays light.
_LAZY = ("program", "Limits")


def __getattr__(name: str) -> _typing.Any:
    """``ledgerflow.program`` (the function), ``ledgerflow.Limits`` and ``__version__``,
    imported when first used."""
    if name in _LAZY:
        from . import programs
        return getattr(programs, name)
    if name == "__version__":   # importlib.metadata costs ~24 ms: only when asked for
        from importlib import metadata
        try:
            version = metadata.version("ledgerflow")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source tree
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'ledgerflow' has no attribute {name!r}")


__all__ = [
    "Approval",
    "CycleError",
    "DefinitionError",
    "InputError",
    "NonRetryableError",
    "NotResumableError",
    "Pipeline",
    "PipelineError",
    "Run",
    "RunContext",
    "RunFailedError",
    "RunNotFoundError",
    "StoreError",
    "Task",
    "TaskCancelled",
    "TaskFailedError",
    "TaskTimedOut",
    "__version__",
    "approvals",
    "approve",
    "cancel",
    "context",
    "get_run",
    "hookimpl",
    "pipeline",
    "plan_resume",
    "reject",
    "resume",
    "run",
    "runs",
    "task",
]
