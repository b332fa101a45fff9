"""The control API: start, resume, cancel and inspect runs by id or target.

Example:
    >>> import ledgerflow as lf
    >>> run = my_pipeline.run(source="docs/")          # doctest: +SKIP
    >>> run.status().state                              # doctest: +SKIP
    'succeeded'
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

from . import deciding, gates
from ._gc import quiet_gc
from .edits import approvals_with_edits
from .errors import InputError, NotResumableError, RunEndedError
from .frontier import read_upstreams
from .launch import (
    Run,
    cancel_submitted,
    continue_run,
    new_run_id,
    read_run,
    refuse_resume,
    resume_inputs,
    start,
)
from .launch import submit as launch_submit
from .loading import abs_target, load_module, load_target, pipelines_in
from .opening import StoreArg, check_executor, make_executor, open_ledger, settings_for, store_for
from .pipeline import Pipeline
from .resume import Action, decide
from .states import RUN_TERMINAL, RunState, TaskState
from .store import RunStore, frontier, reading, summarize, unsettled
from .store import fold as fold_now
from .views import RunView, output_from_json

__all__ = [
    "Run",
    "abs_target",
    "cancel",
    "check_executor",
    "get_run",
    "load_module",
    "load_target",
    "make_executor",
    "new_run_id",
    "open_ledger",
    "pipelines_in",
    "plan_resume",
    "plan_summary",
    "reject",
    "resume",
    "run",
    "runs",
    "start",
    "submit",
]


def run(target: Pipeline[..., Any] | str, /, *args: Any, params: dict[str, Any] | None = None,
        store: StoreArg = None, executor: object = None, workers: int | None = None,
        fail_fast: bool | None = None, wait: bool = True, progress: Any = None,
        logs: bool | None = None, **kwparams: Any) -> Run:
    """Run a pipeline object or ``FILE.py[:NAME]`` target; return the :class:`Run`."""
    pipe = load_target(target) if isinstance(target, str) else target
    return start(pipe, args, {**(params or {}), **kwparams}, store=store, executor=executor,
                 workers=workers, fail_fast=fail_fast, wait=wait, progress=progress, logs=logs,
                 target=abs_target(target, pipe.name) if isinstance(target, str) else None)


def submit(target: Pipeline[..., Any] | str, /, *, params: dict[str, Any] | None = None,
           store: StoreArg = None, **kwparams: Any) -> str:
    """Record a run of a pipeline object or ``FILE.py[:NAME]`` target without driving it.

    Returns the run id; the run is ``submitted`` until ``pipeline worker`` or
    ``pipeline resume RUN_ID`` drives it.
    """
    pipe = load_target(target) if isinstance(target, str) else target
    return launch_submit(pipe, {**(params or {}), **kwparams}, store=store,
                         target=abs_target(target, pipe.name) if isinstance(target, str)
                         else None)


def recorded_pipeline(view: RunView) -> Pipeline[..., Any]:
    """Load the pipeline that started ``view`` from its recorded target.

    Never falls back to another pipeline of the same name: when the target
    cannot be loaded, NotResumableError says how to resume.
    """
    if not view.target:
        raise NotResumableError(
            f"run {view.run_id} recorded no target to load pipeline {view.pipeline!r} from",
            hint=f"pass the pipeline: ledgerflow.resume({view.run_id!r}, pipeline=...)")
    try:
        pipe = load_target(view.target)
    except InputError as exc:
        fix = ("the run was started from a notebook or REPL: resume it there with "
               "ledgerflow.resume(run_id)" if view.target.startswith("__main__:") else
               f"make {view.target} loadable again, or pass pipeline=... to ledgerflow.resume")
        raise NotResumableError(
            f"cannot load pipeline {view.pipeline!r} of run {view.run_id} from "
            f"{view.target}: {exc}", hint=fix) from exc
    if pipe.name != view.pipeline:
        raise NotResumableError(
            f"{view.target} now defines pipeline {pipe.name!r}, but run {view.run_id} "
            f"ran {view.pipeline!r}", hint="restore the pipeline's name, then resume")
    return pipe


def resume(run_id: str, *, store: StoreArg = None, executor: object = None,
           workers: int | None = None, fail_fast: bool | None = None, wait: bool = True,
           pipeline: Pipeline[..., Any] | None = None, progress: Any = None,
           cancel_event: threading.Event | None = None, dask_address: str | None = None,
           logs: bool | None = None, wait_approvals: bool | None = None,
           view: RunView | None = None) -> Run:
    """Continue ``run_id``: keep its successes, retry lost tasks, reset failed ones.

    The pipeline is loaded from the run's recorded target unless ``pipeline``
    is given. ``view``: the run as the caller just read it (its own row at
    least), so it is not read again.

    Raises:
        NotResumableError: the run succeeded, its driver is still alive, or its
            pipeline cannot be loaded.
    """
    settings = settings_for(store, executor, workers, fail_fast, dask_address=dask_address,
                            logs=logs, wait_approvals=wait_approvals)
    st = store_for(settings, store)
    st.recover()        # what killed drivers left reaches the tables (and the cache)
    settle = getattr(st, "settle", None)
    if settle is not None:      # what this process's drives left, folded first (outside
        settle()                # the read blocks, which hold the file; the cache's too)
    with reading(st):   # one connection: the run as the resume starts from it
        if view is None or view.run_id != run_id or not (view.tasks or view.settled):
            # its rows are the runner's prior rows (see continue_run); a frontier read
            # leaves out the successes the resume keeps (ledgerflow.frontier)
            view = frontier(st, run_id)
            if view is None:
                with quiet_gc():
                    view = st.get_run(run_id, upstream=False)
        if any(t.state == TaskState.WAITING_APPROVAL for t in view.tasks.values()):
            deciding.apply_deadlines(st, run_id)    # a pending request: its task waits
        refuse_resume(view)
    # its module is imported with the file free: an import may take seconds (a model
    # library), and a reader holding the file keeps other processes' writes waiting
    pipe = pipeline or recorded_pipeline(view)
    with reading(st):   # one connection: its admission, the cache, the kept results
        graph, cache = resume_inputs(pipe, view, st)
        read_upstreams(view, graph, st)     # the kept results the tasks left need
    return continue_run(pipe, view, st, settings=settings, executor=executor, wait=wait,
                        progress=progress, cancel_event=cancel_event, graph=graph,
                        cache=cache)


def plan_resume(run_id: str, *, store: StoreArg = None) -> list[tuple[str, str, str]]:
    """What a resume would do, per task: ``(key, action, why)``; runs nothing."""
    st = open_ledger(store)
    with quiet_gc():
        view = st.get_run(run_id, upstream=False)
    return _plan(st, view)


def plan_summary(run_id: str, *, store: StoreArg = None
                 ) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    """What a resume would do: the number of tasks per action, and ``(key, action,
    why)`` of each task it would not simply reuse (``pipeline resume --plan``).

    A store that can leave out the successes a resume keeps (the DuckDB store's
    ``unsettled``) is asked for only the other rows: for a run of a million tasks
    with one left, one row is read, not a million.
    """
    st = open_ledger(store)
    found = unsettled(st, run_id)
    if found is None:       # every row, as plan_resume reads them
        with quiet_gc():
            found = st.get_run(run_id, upstream=False), 0
    view, kept = found
    counts: dict[str, int] = {Action.REUSE.value: kept} if kept else {}
    rows = []
    for key, action, why in _plan(st, view):
        counts[action] = counts.get(action, 0) + 1
        if action != Action.REUSE.value:
            rows.append((key, action, why))
    return counts, rows


def _plan(st: RunStore, view: RunView) -> list[tuple[str, str, str]]:
    run_id = view.run_id
    if view.active and view.driver_alive:
        raise NotResumableError(
            f"run {run_id} is being driven right now (pid {view.driver_pid} on "
            f"{view.driver_host}): a resume would be refused, so there is nothing to plan",
            hint=f"wait for it (pipeline status {run_id}), or stop it: pipeline cancel {run_id}")
    return [(row.key, d.action.value, d.why) for row in view.tasks.values()
            for d in (decide(row, result_missing=row.state == TaskState.SUCCEEDED
                             and row.result_uri is not None
                             and not st.blob_exists(row.result_uri)),)]


def get_run(run_id: str, *, store: StoreArg = None, check: bool = True) -> Run:
    """A handle on an existing run (``check=False``: not read yet; the first read
    raises RunNotFoundError if there is no such run)."""
    st = open_ledger(store)
    if check:
        st.get_run(run_id, tasks=False)
    return Run(run_id, st)


def head(run: Run) -> RunView:
    """The run's own row (state, driver, target), without its tasks."""
    return run.store.get_run(run.run_id, tasks=False)


def view(run: Run, *, summed_above: int | None = None, upstream: bool = False) -> RunView:
    """The run as readers see it; with ``summed_above`` a store that can sum a run
    of more tasks than that per task name (the DuckDB store's ``summarize``) does."""
    with reading(run.store):    # a small run: summarize declines, then one read
        if summed_above is not None:
            found: RunView | None = summarize(run.store, run.run_id, min_tasks=summed_above)
            if found is not None:
                return found
        return read_run(run.store, run.run_id, upstream=upstream)


def decisions(run: Run) -> list[dict[str, Any]]:
    """The run's approval requests with their decisions, as recorded (nothing applied)."""
    return run.store.approvals(run.run_id)


def ledger_location(store: StoreArg = None) -> str:
    """Where ``store`` (or the default ledger) is, as a user would name it."""
    if store is not None and not isinstance(store, str):
        return str(store.location)
    return str(settings_for(store).store)


def result_of(run: Run, view: RunView) -> Any:
    """The pipeline's value of ``run``, filled from ``view`` (just read, with its task
    rows) rather than from a new read; raises as :meth:`Run.result` does."""
    if view.state != RunState.SUCCEEDED or not view.tasks:
        return run.result()
    if run.graph is not None:
        output = run.graph.output
    else:
        recorded = json.loads(view.options or "{}")
        if "output" not in recorded:
            return run.result()     # says why it cannot
        output = output_from_json(recorded["output"])
    return run._fill(output, view)     # the handle's own filling, on this view


def ledger_kind(store: StoreArg = None) -> str:
    """The store plugin that keeps ``store`` (``duckdb``, ``postgres``, ``memory``...)."""
    if store is not None and not isinstance(store, str):
        return str(store.name)
    return settings_for(store).store_kind


def reads(run: Run) -> contextlib.AbstractContextManager[None]:
    """A block of reads of ``run`` sharing one ledger connection (see store.reading)."""
    return reading(run.store)


def fold(*, store: StoreArg = None) -> list[str]:
    """Fold what stopped drivers left into the ledger's tables; the runs folded."""
    st = open_ledger(store)
    return fold_now(st) or []


def doctor(*, store: StoreArg = None) -> list[dict[str, Any]]:
    """What is wrong with the ledger: ``{"problem", "what", "fix"}`` per finding."""
    return open_ledger(store).doctor()


def repair(*, store: StoreArg = None) -> tuple[str, list[str]]:
    """Rebuild the ledger's tables from its journals (see RunStore.repair)."""
    return open_ledger(store).repair()


def lineage_formats() -> list[str]:
    """The lineage export formats the installed plugins offer."""
    from .plugins import get_plugin_manager
    hook = get_plugin_manager().hook
    return sorted({f for fs in hook.ledgerflow_lineage_formats() for f in fs})


def export_lineage(run: Run, fmt: str, path: str) -> int | None:
    """Write ``run``'s lineage in ``fmt`` to ``path``; the items written (None: no
    plugin wrote any)."""
    from .plugins import get_plugin_manager
    head(run)               # RunNotFoundError before anything is written
    written: int | None = get_plugin_manager().hook.ledgerflow_export_lineage(
        format=fmt, run_id=run.run_id, store=run.store, path=path)
    return written


def runs(*, store: StoreArg = None, limit: int = 50) -> list[RunView]:
    """The newest runs in the ledger (a waiting run as readers see it: deadlines applied)."""
    st = open_ledger(store)
    return gates.listed(st, st.list_runs(limit))


def approvals(run_id: str | None = None, *, store: StoreArg = None,
              limit: int = 50) -> list[dict[str, Any]]:
    """Requests waiting for a decision: of one run, or of the newest ``limit`` runs
    (each row with its ``run_id``); deadlines that passed are applied first."""
    st = open_ledger(store)
    ids = [run_id] if run_id else [v.run_id for v in st.list_runs(limit)
                                   if v.state not in RUN_TERMINAL]
    if run_id:
        st.get_run(run_id, tasks=False)
    return [{"run_id": rid, **r} for rid in ids for r in deciding.pending(st, rid)]


def edited(run_id: str, *, store: StoreArg = None) -> list[dict[str, Any]]:
    """The run's requests approved with edited arguments, each with its ``edit``
    (``original`` and ``arguments``: :mod:`ledgerflow.edits`)."""
    st = open_ledger(store)
    rows = approvals_with_edits(st.approvals(run_id), st.approval_decisions(run_id))
    return [{"run_id": run_id, **r} for r in rows if r["edit"] is not None]


def approve(run_id: str, task_key: str, *, digest: str, reason: str = "",
            by: str | None = None, store: StoreArg = None,
            arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Approve the request waiting for ``task_key`` in ``run_id`` (from any process).

    ``digest`` is its digest or a prefix (at least 6 characters) as
    :func:`approvals` shows it; a digest that no longer matches (the
    arguments, inputs or payload changed) raises StaleDigestError. Resume the
    run to continue it, if its driver stopped. ``arguments``: a tool call runs with
    these instead of the model's (checked against the tool's schema; InputError and
    nothing recorded if they do not fit, or if the request is not a tool call).
    """
    return deciding.approve(open_ledger(store), run_id, task_key, digest=digest,
                            reason=reason, by=by, arguments=arguments)


def reject(run_id: str, task_key: str, *, reason: str, digest: str | None = None,
           by: str | None = None, store: StoreArg = None) -> dict[str, Any]:
    """Reject the request waiting for ``task_key``: the task fails (reason ``rejected``)."""
    return deciding.reject(open_ledger(store), run_id, task_key, reason=reason,
                           digest=digest, by=by)


def cancel(run_id: str, *, store: StoreArg = None) -> str:
    """Cancel a run: its driver (in any process) picks the request up within ~0.1 s.

    A run no process drives (submitted, waiting for approvals with no driver waiting,
    or whose driver died) is ended here: taken over and cancelled as its driver would
    (a lost attempt recorded lost, every unfinished task ``cancelled``). Returns what
    was done: ``requested`` (a driver stops it) or ``cancelled`` (it ended here).
    """
    st = open_ledger(store)
    st.recover()
    view = st.get_run(run_id, tasks=False)
    if view.state == RunState.SUCCEEDED:
        raise RunEndedError(f"run {run_id} already succeeded; nothing to cancel",
                            hint=f"see it with: pipeline status {run_id}")
    if view.state in RUN_TERMINAL:
        raise RunEndedError(f"run {run_id} already ended {view.state}; nothing to cancel",
                            hint=f"continue it with: pipeline resume {run_id}")
    if view.state == RunState.SUBMITTED:
        cancel_submitted(view, st)
        return "cancelled"
    if view.driver_alive is False:       # nobody would act on a request: end it here
        stop = threading.Event()
        stop.set()
        try:
            resume(run_id, store=st, cancel_event=stop)
        except NotResumableError as exc:
            raise RunEndedError(f"run {run_id} has no driver and cannot be taken over to "
                                f"cancel it: {exc}", hint=exc.hint) from exc
        return "cancelled"
    st.request_cancel(run_id)
    return "requested"
