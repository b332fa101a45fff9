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

from importlib import metadata as _metadata

from .context import RunContext, TaskCancelled, TaskTimedOut, context
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
from .run import Run, cancel, get_run, plan_resume, resume, run, runs
from .task import Task, task

try:
    __version__ = _metadata.version("ledgerflow")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
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
    "cancel",
    "context",
    "get_run",
    "hookimpl",
    "pipeline",
    "plan_resume",
    "resume",
    "run",
    "runs",
    "task",
]
