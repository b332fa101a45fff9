"""The exception hierarchy of ledgerflow.

Every error a user can cause carries a one-line cause (``str(exc)``) and a
one-line fix (``exc.hint``); the CLI prints them as ``Error:`` and ``Hint:``
and exits with ``exc.exit_code``::

    PipelineError
    ├─ DefinitionError ─ DuplicateTaskError, CycleError (also graphlib.CycleError),
    │                    PipelineBodyError
    ├─ InputError ─ ParameterBindError ─ MissingInputError
    │              ApprovalConflictError, StaleDigestError, NotWaitingError,
    │              TaskNotFoundError
    ├─ TaskFailedError      (__cause__ = the user's exception)
    ├─ RunError ─ RunNotFoundError, NotResumableError, RunFailedError, LeaseLostError,
    │             RunEndedError
    ├─ StoreError ─ StoreLockedError, SchemaVersionError, NotALedgerError,
    │               DamagedLedgerError, JournalDamagedError, MissingResultError
    ├─ PluginError, ConfigError
    └─ InvalidTransitionError   (internal invariant: a bug, please report it)

Control-flow signals are not errors: :class:`NonRetryableError` is an
``Exception`` a task raises to stop retrying at once.
"""

from __future__ import annotations

import graphlib
from collections.abc import Iterable, Sequence


class PipelineError(Exception):
    """Base of every error ledgerflow raises on purpose."""

    exit_code: int = 2
    default_hint: str = ""

    #: lines shown under the ``Error:`` line (e.g. the source line and a caret)
    detail: tuple[str, ...] = ()

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint if hint is not None else self.default_hint


class DefinitionError(PipelineError):
    """A pipeline or task definition is invalid; ``problems`` lists them all."""

    def __init__(self, message: str, *, hint: str | None = None,
                 problems: Sequence[str] = ()) -> None:
        super().__init__(message, hint=hint)
        self.problems = list(problems) or [message]


class DuplicateTaskError(DefinitionError):
    """Two different tasks share one name inside a pipeline."""


class CycleError(DefinitionError, graphlib.CycleError):
    """The task graph has a cycle; ``cycle`` lists it, first node repeated."""

    def __init__(self, cycle: Sequence[str], *, problems: Sequence[str] = ()) -> None:
        self.cycle = list(cycle)
        message = "cycle in pipeline: " + " -> ".join(self.cycle)
        DefinitionError.__init__(
            self, message, hint="remove one of these 'after' edges so the graph is acyclic",
            problems=problems or [message])


class PipelineBodyError(DefinitionError):
    """The pipeline body failed while it was traced (``where``: the user's file:line)."""

    def __init__(self, message: str, *, hint: str | None = None, where: str = "") -> None:
        super().__init__(message, hint=hint)
        self.where = where


class InputError(PipelineError):
    """A parameter, file or argument given by the user is wrong."""


class ParameterBindError(InputError, TypeError):
    """Arguments do not fit a task's or pipeline's signature."""


class MissingInputError(ParameterBindError):
    """A required pipeline parameter was not given."""


class ApprovalConflictError(InputError):
    """The request was decided already (two deciders raced: the first one won)."""


class StaleDigestError(InputError):
    """The digest given is not the one of the request that is waiting now."""


class NotWaitingError(InputError):
    """The task has no pending approval request."""


class TaskNotFoundError(InputError):
    """A run has no task with the key asked for (a typo gets the closest keys as a hint)."""

    def __init__(self, run_id: str, task_key: str, known: Iterable[str] = ()) -> None:
        import difflib
        import re

        def order(k: str) -> tuple[float, list[int | str]]:  # best first; [2] before [10]
            parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", k)]
            return -difflib.SequenceMatcher(None, task_key, k).ratio(), parts

        close = sorted(difflib.get_close_matches(task_key, list(known), n=12, cutoff=0.6),
                       key=order)[:3]
        hint = (f"did you mean {' or '.join(repr(k) for k in close)}?" if close
                else f"list its tasks with: pipeline status {run_id}")
        super().__init__(f"run {run_id} has no task {task_key!r}", hint=hint)
        self.run_id = run_id
        self.task_key = task_key


class TaskFailedError(PipelineError):
    """A task failed for good; raised by ``Run.result()`` for that task."""

    exit_code = 1

    def __init__(self, message: str, *, task_key: str, run_id: str, attempt: int,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint or f"inspect it: pipeline status {run_id}")
        self.task_key = task_key
        self.run_id = run_id
        self.attempt = attempt


class RunError(PipelineError):
    """A problem with a run as a whole."""


class RunNotFoundError(RunError):
    """No run with that id is in the ledger."""

    default_hint = "list the runs with: pipeline runs"


class NotResumableError(RunError):
    """The run cannot be resumed now (finished, or its driver is alive)."""


class RunEndedError(RunError):
    """The run already ended, so it cannot be cancelled (or decided) any more."""


class RunFailedError(RunError):
    """The run ended failed or cancelled."""

    exit_code = 1


class StoreError(PipelineError):
    """The ledger cannot be used."""


class StoreLockedError(StoreError):
    """Another process holds the ledger longer than we can wait."""

    default_hint = "wait for the other process, or pass --store PATH"


class SchemaVersionError(StoreError):
    """The ledger was written by a newer ledgerflow."""

    default_hint = "upgrade ledgerflow, or pass --store PATH for a new ledger"


class NotALedgerError(StoreError):
    """The file is not a ledgerflow ledger."""

    default_hint = "pass --store PATH pointing at a ledger (or a new file)"


class DamagedLedgerError(StoreError):
    """The ledger file cannot be read (truncated, corrupt, unwritable parts)."""

    default_hint = "pipeline doctor explains it; pipeline repair rebuilds it from the journals"


class JournalDamagedError(StoreError):
    """A run's journal is damaged before the run's first record."""

    default_hint = "pipeline doctor explains it; pipeline repair rebuilds the ledger"


class MissingResultError(StoreError):
    """A committed result's file is gone from the ledger's side folder."""


class PluginError(PipelineError):
    """A plugin is missing or invalid."""


class ConfigError(PipelineError):
    """A setting has a bad value."""


class InvalidTransitionError(PipelineError):
    """An illegal state transition was attempted: a bug in ledgerflow."""

    exit_code = 70
    default_hint = "this is a bug in ledgerflow, please report it"


class NonRetryableError(Exception):
    """Raise from a task to fail it at once, without further attempts.

    Example:
        >>> raise NonRetryableError("credentials rejected")  # doctest: +SKIP
    """


class LeaseLostError(RunError):
    """Another driver took this run over; records under the old token are refused."""

    exit_code = 1
    default_hint = "the run is driven elsewhere now; watch it with: pipeline status RUN_ID"
