"""The runner's own in-driver attempts: no Job, no hand-off, a context only if asked.

When the executor runs attempts in the driver thread (``runs_in_driver``),
the runner calls each one itself at dispatch, after the commit the attempt
needs (:meth:`~ledgerflow.commits.Journal.due`), and applies its report at
once: nothing is handed to an executor, so no :class:`~ledgerflow.executor.Job`
is made and none is tracked in flight. The attempt itself is
:func:`ledgerflow.executor.call`, the code every executor runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .context import Deferred, RunContext
from .executor import Carrier, Completion, call

if TYPE_CHECKING:
    from .attempt_log import StepResults
    from .commits import LagWriter
    from .gates import Gates
    from .plan import Instance


class Here:
    """What every in-driver attempt of one drive shares (its context is built from it)."""

    __slots__ = ("cancel", "echo", "folders", "gates", "run_id", "steps")

    def __init__(self, run_id: str, cancel: Callable[[], bool], gates: Gates,
                 steps: StepResults, folders: tuple[str | None, str | None],
                 echo: bool) -> None:
        self.run_id, self.cancel, self.gates, self.steps = run_id, cancel, gates, steps
        self.folders, self.echo = folders, echo


class HereContext(Deferred):
    """The context of an in-driver attempt, built only if the task asks (``context()``)."""

    __slots__ = ("attempt", "carrier", "here", "inst")

    def __init__(self, here: Here, inst: Instance, carrier: Carrier | None) -> None:
        self.ctx = None
        self.here, self.inst, self.attempt, self.carrier = here, inst, inst.attempt, carrier

    def build(self) -> RunContext:
        here, inst, attempt, carrier = self.here, self.inst, self.attempt, self.carrier
        return RunContext(run_id=here.run_id, task_key=inst.key, attempt=attempt,
                          _cancel=here.cancel, code_version=inst.node.task.version,
                          _approvals=here.gates.decisions_for(inst.key),
                          _steps=dict(here.steps.for_attempt(inst.key, attempt)),
                          ledger_folder=here.folders[0], run_folder=here.folders[1],
                          carrier=None if carrier is None else dict(carrier.headers))


def attempt_here(here: Here, inst: Instance, args: tuple[Any, ...], kwargs: dict[str, Any],
                 carrier: Carrier | None, lag_writer: LagWriter | None) -> Completion:
    """Run the current attempt of ``inst`` in this (the driver) thread; with a lag writer,
    the journal may be written meanwhile (see :class:`~ledgerflow.commits.LagWriter`)."""
    task, ctx = inst.node.task, HereContext(here, inst, carrier)
    if lag_writer is None:
        return call(0, inst.key, task, args, kwargs, ctx, here.echo, carrier)
    return lag_writer.attempt(call, 0, inst.key, task, args, kwargs, ctx, here.echo, carrier)
