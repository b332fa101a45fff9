"""The plugin author's import surface: everything a plugin may rely on, in one module.

``ledgerflow.__init__`` is for people who write pipelines; this module is for people
who write executors, stores, observers, exporters and CLI commands. A name here keeps
its meaning across releases (or is deprecated first); anything a plugin imports from
another ``ledgerflow`` module is an internal that may move. The built-in plugins are
written against the same names::

    from ledgerflow.spi import hookimpl, Job, Completion, execute    # an executor
    from ledgerflow.spi import RunStore, RecordReads, Blobs, apply   # a store
    from ledgerflow.spi import Record, RunView, TaskState            # an observer

What is here, by the contract it belongs to:

* hooks: :data:`hookimpl` (the marker), :func:`get_plugin_manager`; the hook
  specifications and the run protocol are documented in :mod:`ledgerflow.hookspecs`.
* executors: :class:`Executor` (the protocol), :class:`Job`, :class:`Completion`,
  :func:`execute` (run one attempt where you are), :class:`Carrier`.
* stores: :class:`RunStore` (the protocol), :class:`Lease`, :class:`CacheHit`,
  the optional capabilities :func:`reading`, :func:`summarize`, :func:`unsettled`,
  :func:`frontier`, :func:`task_rows`, :func:`fold`, :func:`lease_probe`, :func:`worker_folders`; the shared read side
  :class:`RecordReads` (inherit it and supply its primitives), :func:`matching`,
  :class:`CacheSQL`; result files :class:`Blobs` and :class:`Encoded`.
* records and views: the journal's typed records (:class:`Record` and its kinds,
  :data:`KINDS`, :data:`RUN_KINDS`, :func:`encode_line`, :func:`decode_line`,
  :func:`columns`, :func:`field_types`), the one projection :func:`apply`, and what
  readers get (:class:`RunView`, :class:`TaskRow`, :class:`TaskGroup`).
* states: :class:`TaskState`, :class:`RunState`, :class:`Outcome`,
  :class:`ApprovalState` and the terminal/active sets.
* settings and identity: :class:`Settings`; :func:`proc_start` and :func:`pid_alive`
  (is the process that holds a lease still the one that took it).
* errors: the :mod:`ledgerflow.errors` hierarchy a plugin raises so the CLI prints a
  cause, a hint and the right exit code.
* CLI: :func:`guard` (wrap a plugin's click command so its errors print like the
  core's), loaded on first use because it imports the CLI.
* contract suites: :mod:`ledgerflow.testing` (``StoreContract``, ``ExecutorContract``).
"""

from __future__ import annotations

from typing import Any

from . import errors
from .blobs import Blobs
from .config import Settings
from .errors import (
    ConfigError,
    DamagedLedgerError,
    DefinitionError,
    InputError,
    JournalDamagedError,
    LeaseLostError,
    MissingResultError,
    NotALedgerError,
    PipelineError,
    PluginError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreLockedError,
    TaskNotFoundError,
)
from .executor import Carrier, Completion, Executor, Job, execute
from .hookspecs import hookimpl
from .keys import code_version, digest
from .ledger import CacheSQL, RecordReads, matching
from .plugins import get_plugin_manager
from .procs import pid_alive, proc_start
from .projection import apply
from .records import (
    KINDS,
    RUN_KINDS,
    AnyRecord,
    ApprovalDecided,
    ApprovalRequested,
    ArtifactRecorded,
    AttemptEnded,
    DriverHeader,
    LogRecorded,
    ModelCall,
    Notice,
    Record,
    ResultRecorded,
    RunDefined,
    RunStateChanged,
    StepRecorded,
    Takeover,
    TaskCreated,
    ToolCall,
    Transition,
    columns,
    decode_line,
    encode_line,
    field_types,
)
from .results import Encoded
from .states import (
    RUN_ACTIVE,
    RUN_TERMINAL,
    TERMINAL,
    ApprovalState,
    Outcome,
    RunState,
    TaskState,
)
from .store import (
    CacheHit,
    Lease,
    RunStore,
    fold,
    frontier,
    lease_probe,
    reading,
    summarize,
    task_rows,
    unsettled,
    worker_folders,
)
from .views import RunView, TaskGroup, TaskRow

__all__ = [
    "KINDS", "RUN_ACTIVE", "RUN_KINDS", "RUN_TERMINAL", "TERMINAL",
    "AnyRecord", "ApprovalDecided", "ApprovalRequested", "ApprovalState",
    "ArtifactRecorded", "AttemptEnded", "Blobs", "CacheHit", "CacheSQL", "Carrier",
    "Completion", "ConfigError", "DamagedLedgerError", "DefinitionError", "DriverHeader",
    "Encoded", "Executor", "InputError", "Job", "JournalDamagedError", "Lease",
    "LeaseLostError", "LogRecorded", "MissingResultError", "ModelCall", "NotALedgerError",
    "Notice", "Outcome", "PipelineError", "PluginError", "Record", "RecordReads",
    "ResultRecorded", "RunDefined", "RunNotFoundError", "RunState", "RunStateChanged",
    "RunStore", "RunView", "SchemaVersionError", "Settings", "StepRecorded", "StoreError",
    "StoreLockedError", "Takeover", "TaskCreated", "TaskGroup", "TaskNotFoundError",
    "TaskRow", "TaskState", "ToolCall", "Transition",
    "apply", "code_version", "columns", "decode_line", "digest", "encode_line", "errors",
    "execute", "field_types", "fold", "frontier", "get_plugin_manager", "guard", "hookimpl",  # noqa: F822
    "lease_probe", "matching", "pid_alive", "proc_start", "reading", "summarize",
    "task_rows", "unsettled", "worker_folders",
]


def __getattr__(name: str) -> Any:
    if name == "guard":                 # the CLI (click, rich) only for plugins that add commands
        from .cli.guard import guard
        return guard
    raise AttributeError(f"module 'ledgerflow.spi' has no attribute {name!r}")
