"""Starting and driving runs of a pipeline object, and the :class:`Run` handle.

This is the layer ``Pipeline.run`` calls; it never imports user code (finding
a pipeline by its recorded target is :mod:`ledgerflow.control`'s job).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import deciding, gates, recipe
from ._gc import quiet_gc
from .config import Settings
from .edits import approvals_with_edits, calls_with_edits
from .errors import (
    InputError,
    NotResumableError,
    RunFailedError,
    TaskFailedError,
    TaskNotFoundError,
)
from .graph import Graph
from .observers import Observers
from .opening import StoreArg, make_executor, settings_for, store_for
from .plan import UNSET
from .states import RUN_TERMINAL, RunState, TaskState
from .store import Lease, RunStore
from .task import MapRef, TaskRef
from .views import RunView, output_from_json, output_to_json, usage_summary

if TYPE_CHECKING:
    from .executor import Executor
    from .pipeline import Pipeline
    from .runner import Runner


def new_run_id() -> str:
    """A sortable, unique run id such as ``20261129-194138-3fa9c2``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


class Run:
    """A handle on one run: watch it, wait for it, read its results, cancel it."""

    def __init__(self, run_id: str, store: RunStore, *, graph: Graph | None = None,
                 runner: Runner | None = None) -> None:
        self.run_id = run_id
        self.store = store
        self.graph = graph
        self._runner = runner
        self._thread: threading.Thread | None = None
        self._state: str | None = None
        self._error: BaseException | None = None

    # -- driving ------------------------------------------------------------------------
    def _drive(self) -> None:
        runner = self._runner
        assert runner is not None and runner.lease is not None
        try:
            self._state = runner.drive()
        except BaseException as exc:
            self._error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            try:
                self.store.release(runner.lease)
            finally:
                runner.observers.run_finish(self.run_id, self._state or "interrupted")

    def _start(self, wait: bool) -> Run:
        if wait:
            self._drive()
            if self._error is not None:
                raise self._error
        else:
            self._thread = threading.Thread(target=self._drive, name=f"ledgerflow-{self.run_id}",
                                            daemon=True)
            self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run stops driving here; return its state."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._error is not None:
                raise self._error
        return self.state

    @property
    def done(self) -> bool:
        """True when this process is not (or no longer) driving the run."""
        return self._thread is None or not self._thread.is_alive()

    # -- inspecting ---------------------------------------------------------------------
    @property
    def state(self) -> str:
        """The run's state: as this process ended it, else as the ledger records it."""
        return self._state or self.store.get_run(self.run_id, tasks=False).state

    def status(self) -> RunView:
        """Read the run and its tasks from the ledger (decisions not yet applied shown)."""
        return read_run(self.store, self.run_id)

    def tasks(self) -> list[dict[str, Any]]:
        """One dict per task (key, task, state, attempts, times, error)."""
        return [t.as_json() for t in self.status().tasks.values()]

    def cancel(self) -> None:
        """Ask the run to cancel (works from any process, see :func:`ledgerflow.cancel`)."""
        if self._runner is not None:
            self._runner.cancel_event.set()
        self.store.request_cancel(self.run_id)

    def settle(self) -> Run:
        """Wait until the ledger's SQL tables hold this run, for plain SQL on the file
        from this process: the DuckDB store folds a run's journal into them just after
        the run returns (its reads, ``status()`` among them, never need to wait)."""
        self.wait()
        settle = getattr(self.store, "settle", None)
        if settle is not None:
            settle(self.run_id)
        return self

    def lineage(self, task_key: str | None = None) -> list[dict[str, Any]]:
        """Lineage rows of the run (or one task)."""
        return self.store.lineage(self.run_id, task_key)

    def attempts(self, task_key: str | None = None) -> list[dict[str, Any]]:
        """Finished attempts with their outcomes."""
        return self.store.attempts(self.run_id, task_key)

    def notices(self) -> list[dict[str, Any]]:
        """Rejected late or duplicate results and other notes."""
        return self.store.notices(self.run_id)

    def approvals(self, pending_only: bool = False) -> list[dict[str, Any]]:
        """The run's approval requests with their decisions (``state``: pending,
        approved, rejected, expired); deadlines that passed are applied first."""
        gates.apply_deadlines(self.store, self.run_id)
        rows = approvals_with_edits(self.store.approvals(self.run_id),
                                    self.store.approval_decisions(self.run_id))
        return gates.waiting_requests(rows) if pending_only else rows

    def approve(self, task_key: str, *, digest: str, reason: str = "",
                by: str | None = None, arguments: dict[str, Any] | None = None
                ) -> dict[str, Any]:
        """Approve the request waiting for ``task_key`` (``digest``: its digest or a
        prefix of it, as shown by :meth:`approvals`); ``arguments``: a tool call's
        edited arguments (see :func:`ledgerflow.approve`). Then resume the run."""
        return deciding.approve(self.store, self.run_id, task_key, digest=digest,
                             reason=reason, by=by, arguments=arguments)

    def reject(self, task_key: str, *, reason: str, digest: str | None = None,
               by: str | None = None) -> dict[str, Any]:
        """Reject the request waiting for ``task_key``: it fails with reason ``rejected``."""
        return deciding.reject(self.store, self.run_id, task_key, reason=reason,
                               digest=digest, by=by)

    def logs(self, task_key: str | None = None, attempt: int | None = None
             ) -> list[dict[str, Any]]:
        """What attempts wrote (stdout, stderr, logging): one dict per attempt with
        ``task_key``, ``attempt``, ``stream``, ``text`` and ``dropped`` (bytes cut)."""
        return self.store.logs(self.run_id, task_key, attempt)

    def usage(self) -> dict[str, Any]:
        """Tokens, cost and calls of the run's model calls: totals and per task, model
        and key (``pipeline usage RUN_ID --json``)."""
        return usage_summary(self.store.model_calls(self.run_id),
                             self.store.tool_calls(self.run_id))

    def model_calls(self) -> list[dict[str, Any]]:
        """Every model call of the run, in order."""
        return self.store.model_calls(self.run_id)

    def tool_calls(self) -> list[dict[str, Any]]:
        """Every tool call of the run, in order; ``edit``: how its approver edited its
        arguments (``original``, ``arguments``; None: ran as the model asked)."""
        st = self.store
        return calls_with_edits(st.tool_calls(self.run_id), st.approvals(self.run_id),
                                st.approval_decisions(self.run_id))

    def events(self, task_key: str | None = None) -> list[dict[str, Any]]:
        """Every task transition (seq, task, attempt, from, to, reason, time), in order."""
        return self.store.events(self.run_id, task_key)

    def explain(self, task_key: str | None = None, against: str | None = None) -> Any:
        """Why each task ran or was reused (:func:`ledgerflow.explain.explain_run`)."""
        from .explain import explain_run
        return explain_run(self.store, self.run_id, task_key=task_key, against=against)

    def result(self, task_key: str | None = None) -> Any:
        """Return the pipeline's return value, or one task's result.

        Raises:
            RunFailedError: the run did not succeed (for the pipeline value).
            TaskFailedError: that task did not succeed.
        """
        self.wait()
        if task_key is not None:
            return self._task_value(task_key)
        view = self.status()
        if view.state != RunState.SUCCEEDED:
            bad = view.root_causes() or [t for t in view.tasks.values()
                                         if t.state != TaskState.SUCCEEDED]
            first = bad[0] if bad else None
            detail = f"; first: {first.key} {first.state}: {first.error}" if first else ""
            raise RunFailedError(f"run {self.run_id} ended {view.state}{detail}",
                                 hint=f"inspect it with: pipeline status {self.run_id}")
        if self.graph is not None:
            output = self.graph.output
        else:
            recorded = json.loads(view.options or "{}")
            if "output" not in recorded:
                raise InputError(f"run {self.run_id} was recorded without its output "
                                 "structure (an older ledgerflow)",
                                 hint="read one task's result: run.result(task_key)")
            output = output_from_json(recorded["output"])
        return self._fill(output, view)

    def _fill(self, value: Any, view: RunView) -> Any:
        t = type(value)
        if t is TaskRef:
            return self._task_value(value.key, view)
        if t is MapRef:
            kids = [r for r in view.tasks.values() if r.node == value.key and r.position is not None]
            kids.sort(key=lambda r: r.position or 0)
            return [self._task_value(r.key, view) for r in kids]
        if t is list or t is tuple:
            return t(self._fill(v, view) for v in value)
        if t is dict:
            return {k: self._fill(v, view) for k, v in value.items()}
        return value

    def _task_value(self, key: str, view: RunView | None = None) -> Any:
        runner = self._runner
        if runner is not None:
            inst = runner.plan.insts.get(key)
            if inst is not None and inst.state == TaskState.SUCCEEDED \
                    and inst.value is not UNSET:
                return inst.value
        view = view or self.status()
        row = view.tasks.get(key)
        if row is None:
            raise TaskNotFoundError(self.run_id, key, view.tasks)
        if row.state != TaskState.SUCCEEDED:
            raise TaskFailedError(f"task {key!r} is {row.state}: {row.error}", task_key=key,
                                  run_id=self.run_id, attempt=row.attempts)
        return self.store.read_blob(row.result_kind or "json", row.result_data,
                                    row.result_uri)

    def __repr__(self) -> str:
        return f"<Run {self.run_id} {self.state}>"

    def _repr_html_(self) -> str:
        from .display import run_html
        view = self.status()
        waiting = self.approvals(pending_only=True) if view.state == RunState.WAITING \
            or any(t.state == TaskState.WAITING_APPROVAL for t in view.tasks.values()) \
            else []
        return run_html(view, approvals=waiting)


def read_run(st: RunStore, run_id: str, *, upstream: bool = True) -> RunView:
    """A run as readers see it: with decisions a driver has not applied yet shown."""
    with quiet_gc():        # a row object a task: the collector would rescan them all
        view = st.get_run(run_id, upstream=upstream)
    if any(t.state == TaskState.WAITING_APPROVAL for t in view.tasks.values()):
        gates.apply_deadlines(st, run_id)
        gates.overlay(view, st.approvals(run_id))
    return view


# -- starting and continuing ------------------------------------------------------------

def start(pipe: Pipeline[..., Any], args: Sequence[Any], params: dict[str, Any], *,
          store: StoreArg = None, executor: object = None, workers: int | None = None,
          fail_fast: bool | None = None, wait: bool = True, run_id: str | None = None,
          target: str | None = None, progress: Any = None,
          cancel_event: threading.Event | None = None, dask_address: str | None = None,
          graph: Graph | None = None, logs: bool | None = None,
          wait_approvals: bool | None = None) -> Run:
    """Validate, record and drive a new run of ``pipe`` (see :meth:`Pipeline.run`).

    ``graph``: the graph already built from these parameters (the CLI builds it
    to validate before printing the run id), so the body is traced once.
    """
    settings = settings_for(store, executor, workers, fail_fast, dask_address=dask_address,
                            logs=logs, wait_approvals=wait_approvals)
    values = pipe.bind(*args, **params)
    if graph is None:
        graph = pipe.build(**values)          # validation before anything is written
    ex = make_executor(executor if executor is not None and not isinstance(executor, str)
                       else settings.executor, settings)
    st = store_for(settings, store)
    pipe.admit(st)        # e.g. a machine-written draft whose digest is not approved
    st.recover()          # what killed drivers left unfolded reaches the cache index
    run_id = run_id or new_run_id()
    cache = st.cache_lookup(sorted({n.task.name for n in graph if n.task.options.cache}))
    runner = _runner(graph, st, ex, settings, run_id, None, cache,
                     Observers.from_plugins(progress=progress), cancel_event)
    runner.create(pipeline=pipe.name, target=target or pipe.target(), params=values,
                  options={"executor": getattr(ex, "name", str(ex)),
                           "workers": settings.workers,
                           "output": output_to_json(graph.output),
                           **recipe.recorded(pipe, graph, st)})
    return _drive(pipe, runner, wait, resumed=False)


def submit(pipe: Pipeline[..., Any], params: dict[str, Any], *, store: StoreArg = None,
           target: str | None = None, run_id: str | None = None) -> str:
    """Validate and record a new run of ``pipe`` without driving it; return its id.

    The run is ``submitted``: ``pipeline worker`` or ``pipeline resume`` drives it.
    """
    settings = settings_for(store)
    values = pipe.bind(**params)
    graph = pipe.build(**values)
    st = store_for(settings, store)
    pipe.admit(st)
    run_id = run_id or new_run_id()
    from .executor import NoExecutor  # (the runner's modules: imported when a run starts)
    from .runner import Runner
    runner = Runner(graph=graph, store=st, executor=NoExecutor(), settings=settings,
                    run_id=run_id)
    lease = runner.create(pipeline=pipe.name, target=target or pipe.target(), params=values,
                          options={"output": output_to_json(graph.output)}, submit=True)
    st.release(lease)
    return run_id


def cancel_submitted(view: RunView, st: RunStore) -> None:
    """Cancel a run that was submitted and never driven."""
    lease = st.take_over(view.run_id)
    try:
        from .executor import NoExecutor
        from .runner import Runner
        runner = Runner(graph=Graph(view.pipeline), store=st, executor=NoExecutor(),
                        settings=settings_for(st), run_id=view.run_id, prior=view)
        runner.cancel_submitted(lease, "cancelled before a driver took it")
    finally:
        st.release(lease)


def continue_run(pipe: Pipeline[..., Any], view: RunView, st: RunStore, *,
                 settings: Settings, executor: object = None, wait: bool = True,
                 progress: Any = None, cancel_event: threading.Event | None = None,
                 graph: Graph | None = None, cache: Mapping[str, Any] | None = None) -> Run:
    """Take over the run ``view`` (recorded by ``pipe``) and drive it to its end.

    ``view`` with its task rows is used as the prior state when no driver can
    have written since it was read (the run ended, or its driver is known dead:
    its unfolded tail is already in the view); else the run is read again once
    the takeover fenced the old driver off. ``graph`` and ``cache``: as
    :func:`resume_inputs` returned them, read with the view.
    """
    if graph is None or cache is None:
        st.recover()      # what killed drivers left unfolded reaches the cache index
        graph, cache = resume_inputs(pipe, view, st)
    ex = make_executor(executor if executor is not None and not isinstance(executor, str)
                       else settings.executor, settings)
    lease: Lease = st.take_over(view.run_id)
    # ``view`` is the prior only if no other driver took the run over since it was read
    # (the lease's token comes right after the view's): else it may predate a whole drive
    settled = bool(view.tasks or view.settled) and lease.token == view.token + 1 and (
        view.driver_alive is False or view.state in RUN_TERMINAL)
    if settled:
        prior = view
    else:
        with quiet_gc():
            prior = st.get_run(view.run_id, upstream=False)
        if graph.partial:   # read before another drive: what it left may differ
            graph = pipe.build(**json.loads(view.params))
            cache = _cache_of(graph, st, view.run_id)
    observers = Observers.from_plugins(progress=progress)
    observers.begin(prior.counts())     # the display starts from the counts the run had
    runner = _runner(graph, st, ex, settings, view.run_id, prior, cache, observers,
                     cancel_event)
    runner.take_over(lease)
    return _drive(pipe, runner, wait, resumed=True)


def resume_inputs(pipe: Pipeline[..., Any], view: RunView, st: RunStore
                  ) -> tuple[Graph, Mapping[str, Any]]:
    """What a resume of ``view`` needs before its takeover: the graph rebuilt from
    the run's parameters (admitted again) and the cache of the other runs.

    Call it in the :func:`~ledgerflow.store.reading` block that read ``view``:
    the cache is then read on the same connection.
    """
    graph = recipe.resume_graph(pipe, view, st)
    pipe.admit(st)        # a spec edited since the run started needs its approval again
    return graph, _cache_of(graph, st, view.run_id)


def _cache_of(graph: Graph, st: RunStore, run_id: str) -> Mapping[str, Any]:
    """The other runs' results the cached tasks of ``graph`` may reuse."""
    names = sorted({n.task.name for n in graph if n.task.options.cache})
    with quiet_gc():
        return st.cache_lookup(names, exclude_run=run_id) if names else {}


def _runner(graph: Graph, st: RunStore, ex: Executor, settings: Settings, run_id: str,
            prior: RunView | None, cache: Mapping[str, Any], observers: Observers,
            cancel_event: threading.Event | None) -> Runner:
    from .runner import Runner
    return Runner(graph=graph, store=st, executor=ex, settings=settings, run_id=run_id,
                  prior=prior, cache=cache, observers=observers, cancel_event=cancel_event)


def _drive(pipe: Pipeline[..., Any], runner: Runner, wait: bool, *, resumed: bool) -> Run:
    runner.observers.run_start(runner.run_id, pipe.name, resumed)
    run = Run(runner.run_id, runner.store, graph=runner.graph, runner=runner)
    return run._start(wait)


def refuse_resume(view: RunView) -> None:
    """Raise NotResumableError if ``view`` cannot be resumed at all."""
    if view.state == RunState.SUCCEEDED:
        raise NotResumableError(f"run {view.run_id} already succeeded; nothing to resume",
                                hint="start a new run with: pipeline run ...")
