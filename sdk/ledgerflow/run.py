"""Start, resume, cancel and inspect runs: the Python API the CLI wraps.

Example:
    >>> import ledgerflow as lf
    >>> run = my_pipeline.run(source="docs/")          # doctest: +SKIP
    >>> run.status().state                              # doctest: +SKIP
    'succeeded'
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._gc import quiet_gc
from .config import Settings
from .errors import (
    InputError,
    NotResumableError,
    PipelineError,
    PluginError,
    RunFailedError,
    TaskFailedError,
)
from .executor import Executor
from .graph import Graph
from .pipeline import REGISTRY, Pipeline
from .plugins import get_plugin_manager
from .runner import Runner, driver_header, params_json
from .scheduler import _UNSET
from .store import RunStore, RunView
from .task import MapRef, TaskRef


def new_run_id() -> str:
    """A sortable, unique run id such as ``20261129-194138-3fa9c2``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def open_store(settings: Settings) -> RunStore:
    """Build the store named by ``settings.store_kind`` through the plugins."""
    pm = get_plugin_manager()
    store = pm.hook.ledgerflow_make_store(name=settings.store_kind, settings=settings)
    if store is None:
        names = sorted({n for ns in pm.hook.ledgerflow_store_names() for n in ns})
        raise PluginError(f"store {settings.store_kind!r} not found; installed: "
                          + ", ".join(names),
                          hint="install a plugin that provides it, or use --store-kind duckdb")
    return store  # type: ignore[no-any-return]


def check_executor(name: str | None) -> None:
    """Raise PluginError unless an executor plugin offers ``name``."""
    if name is None:
        return
    pm = get_plugin_manager()
    names = sorted({n for ns in pm.hook.ledgerflow_executor_names() for n in ns})
    if name not in names:
        raise PluginError(f"executor {name!r} not found; installed: " + ", ".join(names),
                          hint="install a plugin that provides it, or use --executor threads")


def make_executor(name: object, settings: Settings) -> Executor:
    """Build the executor called ``name`` (or pass an instance through)."""
    if not isinstance(name, str):
        if not isinstance(name, Executor):
            raise PluginError(f"{name!r} is not an executor (no start/submit/cancel/shutdown)",
                              hint="pass an executor name, e.g. executor='threads'")
        return name
    pm = get_plugin_manager()
    ex = pm.hook.ledgerflow_make_executor(name=name, settings=settings)
    if ex is None:
        names = sorted({n for ns in pm.hook.ledgerflow_executor_names() for n in ns})
        raise PluginError(f"executor {name!r} not found; installed: " + ", ".join(names),
                          hint="install a plugin that provides it, or use --executor threads")
    return ex  # type: ignore[no-any-return]


_MEMORY_STORES: dict[str, RunStore] = {}


def _settings(store: str | None, executor: object, workers: int | None,
              fail_fast: bool | None, **extra: Any) -> Settings:
    extra = {k: v for k, v in extra.items() if v is not None}
    kw: dict[str, Any] = {"workers": workers, "fail_fast": fail_fast}
    if isinstance(executor, str):
        kw["executor"] = executor
    if store is not None:
        if store == ":memory:" or store.startswith("memory:"):
            kw["store_kind"] = "memory"
        kw["store"] = store
    kw.update(extra)
    return Settings.from_env(**kw)


def _store_for(settings: Settings) -> RunStore:
    if settings.store_kind == "memory":   # one memory store per name per process
        st = _MEMORY_STORES.get(settings.store)
        if st is None:
            st = _MEMORY_STORES[settings.store] = open_store(settings)
        return st
    return open_store(settings)


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
        from .plugins import get_plugin_manager
        pm = get_plugin_manager()
        assert self._runner is not None
        try:
            self._state = self._runner.drive()
        except BaseException as exc:
            self._error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            try:
                self.store.release(self._runner.lease)
            finally:
                try:
                    pm.hook.ledgerflow_run_finish(run_id=self.run_id,
                                                  state=self._state or "interrupted")
                except Exception:
                    pass

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
        """The run's state as recorded in the ledger."""
        return self._state or self.status().state

    def status(self) -> RunView:
        """Read the run and its tasks from the ledger."""
        return self.store.get_run(self.run_id)

    def tasks(self) -> list[dict[str, Any]]:
        """One dict per task (key, task, state, attempts, times, error)."""
        return [t.as_json() for t in self.status().tasks.values()]

    def cancel(self) -> None:
        """Ask the run to cancel (works from any process, see :func:`cancel`)."""
        if self._runner is not None:
            self._runner.cancel_event.set()
        self.store.request_cancel(self.run_id)

    def lineage(self, task_key: str | None = None) -> list[dict[str, Any]]:
        """Lineage rows of the run (or one task)."""
        return self.store.lineage(self.run_id, task_key)

    def attempts(self, task_key: str | None = None) -> list[dict[str, Any]]:
        """Finished attempts with their outcomes."""
        return self.store.attempts(self.run_id, task_key)

    def notices(self) -> list[dict[str, Any]]:
        """Rejected late or duplicate results and other notes."""
        return self.store.notices(self.run_id)

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
        if view.state != "succeeded":
            bad = [t for t in view.tasks.values() if t.state not in ("succeeded",)]
            first = bad[0] if bad else None
            detail = f"; first: {first.key} {first.state}: {first.error}" if first else ""
            raise RunFailedError(f"run {self.run_id} ended {view.state}{detail}",
                                 hint=f"inspect it with: pipeline status {self.run_id}")
        graph = self.graph
        if graph is None:
            graph = _load_pipeline(view).build(**json.loads(view.params))
        return self._fill(graph.output, view)

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
            if inst is not None and inst.state == "succeeded" and inst.value is not _UNSET:
                return inst.value
        view = view or self.status()
        row = view.tasks.get(key)
        if row is None:
            raise InputError(f"run {self.run_id} has no task {key!r}",
                             hint="list its tasks with: pipeline status " + self.run_id)
        if row.state != "succeeded":
            raise TaskFailedError(f"task {key!r} is {row.state}: {row.error}", task_key=key,
                                  run_id=self.run_id, attempt=row.attempts)
        return self.store.read_blob(row.result_kind or "json", row.result_data,
                                    row.result_uri)

    def __repr__(self) -> str:
        return f"<Run {self.run_id} {self.state}>"

    def _repr_html_(self) -> str:
        from .display import run_html
        return run_html(self.status())


# -- starting and resuming --------------------------------------------------------------

def start(pipe: Pipeline[..., Any], args: Sequence[Any], params: dict[str, Any], *,
          store: str | None = None, executor: object = None, workers: int | None = None,
          fail_fast: bool | None = None, wait: bool = True, run_id: str | None = None,
          target: str | None = None, progress: Any = None,
          cancel_event: threading.Event | None = None, dask_address: str | None = None) -> Run:
    """Validate, record and drive a new run of ``pipe`` (see :meth:`Pipeline.run`)."""
    settings = _settings(store, executor, workers, fail_fast, dask_address=dask_address)
    values = pipe.bind(*args, **params)
    graph = pipe.build(**values)                      # validation before anything is written
    ex = make_executor(executor if executor is not None and not isinstance(executor, str)
                       else settings.executor, settings)
    st = _store_for(settings)
    run_id = run_id or new_run_id()
    cache = st.cache_lookup(sorted({n.task.name for n in graph if n.task.options.cache}))
    created = time.time()
    d = ("D", run_id, pipe.name, target or _target_of(pipe), params_json(values), created,
         json.dumps({"executor": getattr(ex, "name", str(ex)), "workers": settings.workers}))
    lease = st.create_run(run_id, [d, driver_header(1), ("S", "running", "", created)])
    return _drive(pipe, graph, st, ex, settings, run_id, lease, None, cache, wait, False,
                  progress, cancel_event)


def _drive(pipe: Pipeline[..., Any], graph: Graph, st: RunStore, ex: Executor,
           settings: Settings, run_id: str, lease: Any, prior: RunView | None,
           cache: dict[str, tuple[Any, ...]], wait: bool, resumed: bool,
           progress: Any, cancel_event: threading.Event | None = None) -> Run:
    pm = get_plugin_manager()
    hook = pm.hook.ledgerflow_task_state_changed
    runner = Runner(graph=graph, store=st, executor=ex, settings=settings, run_id=run_id,
                    lease=lease, prior=prior, cache=cache,
                    hook_changed=hook if hook.get_hookimpls() else None,
                    on_change=progress, cancel_event=cancel_event)
    try:
        pm.hook.ledgerflow_run_start(run_id=run_id, pipeline=pipe.name, resumed=resumed)
    except Exception:
        pass
    run = Run(run_id, st, graph=graph, runner=runner)
    return run._start(wait)


def resume(run_id: str, *, store: str | None = None, executor: object = None,
           workers: int | None = None, fail_fast: bool | None = None, wait: bool = True,
           pipeline: Pipeline[..., Any] | None = None, progress: Any = None,
           cancel_event: threading.Event | None = None, dask_address: str | None = None) -> Run:
    """Continue ``run_id``: keep its successes, retry lost tasks, reset failed ones.

    Raises:
        NotResumableError: the run succeeded, or its driver is still alive.
    """
    settings = _settings(store, executor, workers, fail_fast, dask_address=dask_address)
    st = _store_for(settings)
    view = st.get_run(run_id, tasks=False)
    if view.state == "succeeded":
        raise NotResumableError(f"run {run_id} already succeeded; nothing to resume",
                                hint="start a new run with: pipeline run ...")
    pipe = pipeline or _load_pipeline(view)
    graph = pipe.build(**json.loads(view.params))
    ex = make_executor(executor if executor is not None and not isinstance(executor, str)
                       else settings.executor, settings)
    lease = st.take_over(run_id)
    # re-read: the takeover folded what the old driver left
    with quiet_gc():
        prior = st.get_run(run_id, upstream=False)
    cache = st.cache_lookup(sorted({n.task.name for n in graph if n.task.options.cache}),
                            exclude_run=run_id)
    st.append(lease, [driver_header(lease.token), ("S", "running", "resumed", time.time())])
    return _drive(pipe, graph, st, ex, settings, run_id, lease, prior, cache, wait, True,
                  progress, cancel_event)


def plan_resume(run_id: str, *, store: str | None = None) -> list[tuple[str, str, str]]:
    """What a resume would do, per task: ``(key, action, why)``; runs nothing."""
    st = _store_for(_settings(store, None, None, None))
    with quiet_gc():
        view = st.get_run(run_id, upstream=False)
    out = []
    for row in view.tasks.values():
        s = row.state
        if s == "succeeded":
            out.append((row.key, "reuse", "cached result" if row.cached_from else "succeeded"))
        elif s in ("running", "cancelling"):
            out.append((row.key, "rerun", f"attempt {row.attempts} was {s} when the driver "
                        "stopped: recorded as lost"))
        elif s in ("failed", "cancelled", "upstream_failed"):
            out.append((row.key, "rerun", f"was {s}: reset with a fresh attempt budget"))
        else:
            out.append((row.key, "run", f"was {s}"))
    return out


def _target_of(pipe: Pipeline[..., Any]) -> str | None:
    mod = sys.modules.get(pipe.fn.__module__)
    path = getattr(mod, "__file__", None)
    if path and pipe.fn.__module__ == "__main__":
        return f"{os.path.abspath(path)}:{pipe.name}"
    if mod is not None and getattr(mod, "__ledgerflow_file__", None):
        return f"{mod.__ledgerflow_file__}:{pipe.name}"
    if mod is not None and path:
        return f"{pipe.fn.__module__}:{pipe.name}"
    return None


def _load_pipeline(view: RunView) -> Pipeline[..., Any]:
    if view.pipeline in REGISTRY and view.target is None:
        return REGISTRY[view.pipeline]
    if view.target:
        try:
            return load_target(view.target)
        except PipelineError:
            if view.pipeline in REGISTRY:
                return REGISTRY[view.pipeline]
            raise
    if view.pipeline in REGISTRY:
        return REGISTRY[view.pipeline]
    raise NotResumableError(
        f"pipeline {view.pipeline!r} of run {view.run_id} is not defined in this process",
        hint="run the cell or import the module that defines it, then resume again")


def load_module(path: str | Path) -> Any:
    """Import a pipeline file by path (its folder goes on ``sys.path``)."""
    p = Path(path).resolve()
    if not p.exists():
        raise InputError(f"pipeline file not found: {path}",
                         hint="pass the path of a .py file, e.g. pipeline run flows.py")
    if p.suffix != ".py":
        raise InputError(f"pipeline file must be a .py file, given: {path}",
                         hint="pass a Python module that defines an @pipeline")
    for mod in list(sys.modules.values()):
        if getattr(mod, "__ledgerflow_file__", None) == str(p):
            return mod
    folder = str(p.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = p.stem if p.stem not in sys.modules else f"{p.stem}_{abs(hash(str(p))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, p)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__ledgerflow_file__ = str(p)  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise InputError(f"syntax error in {path}:{exc.lineno}: {exc.msg}",
                         hint="fix the pipeline module and run again") from exc
    except Exception as exc:
        del sys.modules[name]
        raise InputError(f"importing {path} failed: {type(exc).__name__}: {exc}",
                         hint="fix the error raised while the module is imported "
                         "(run with --debug for the traceback)") from exc
    return module


def pipelines_in(module: Any) -> dict[str, Pipeline[..., Any]]:
    """The pipelines a module defines, by name."""
    return {v.name: v for v in vars(module).values() if isinstance(v, Pipeline)}


def load_target(target: str) -> Pipeline[..., Any]:
    """Load ``FILE.py[:NAME]`` or ``package.module:NAME``."""
    path, _, name = target.rpartition(":") if target.count(":") and not (
        len(target) > 1 and target[1] == ":" and target.count(":") == 1) else (target, "", "")
    if not path:
        path, name = target, ""
    if path.endswith((".json", ".toml")):
        from .spec import load_spec
        return load_spec(path)
    if path.endswith(".py") or os.sep in path:
        module = load_module(path)
    else:
        try:
            module = importlib.import_module(path)
        except ImportError as exc:
            raise InputError(f"cannot import module {path!r}: {exc}",
                             hint="pass FILE.py[:PIPELINE] or an importable module") from None
    found = pipelines_in(module)
    if not found:
        raise InputError(f"{path} defines no @pipeline",
                         hint="decorate a function with @pipeline")
    if name:
        if name not in found:
            raise InputError(f"{path} has no pipeline {name!r}; it has: "
                             + ", ".join(sorted(found)),
                             hint=f"pass {path}:{sorted(found)[0]}")
        return found[name]
    if len(found) > 1:
        raise InputError(f"{path} defines several pipelines: " + ", ".join(sorted(found)),
                         hint=f"choose one: {path}:{sorted(found)[0]}")
    return next(iter(found.values()))


# -- module-level helpers ---------------------------------------------------------------

def run(target: Pipeline[..., Any] | str, /, *args: Any, params: dict[str, Any] | None = None,
        store: str | None = None, executor: object = None, workers: int | None = None,
        fail_fast: bool | None = None, wait: bool = True, progress: Any = None,
        **kwparams: Any) -> Run:
    """Run a pipeline object or ``FILE.py[:NAME]`` target; return the :class:`Run`."""
    pipe = load_target(target) if isinstance(target, str) else target
    return start(pipe, args, {**(params or {}), **kwparams}, store=store, executor=executor,
                 workers=workers, fail_fast=fail_fast, wait=wait, progress=progress,
                 target=_abs_target(target) if isinstance(target, str) else None)


def _abs_target(target: str) -> str:
    path, sep, name = target.partition(":")
    if path.endswith((".py", ".json", ".toml")):
        return str(Path(path).resolve()) + sep + name
    return target


def get_run(run_id: str, *, store: str | None = None) -> Run:
    """A handle on an existing run."""
    st = _store_for(_settings(store, None, None, None))
    st.get_run(run_id, tasks=False)      # raises RunNotFoundError; task rows not needed
    return Run(run_id, st)


def runs(*, store: str | None = None, limit: int = 50) -> list[RunView]:
    """The newest runs in the ledger."""
    return _store_for(_settings(store, None, None, None)).list_runs(limit)


def cancel(run_id: str, *, store: str | None = None) -> None:
    """Ask a run to cancel; its driver (in any process) picks it up within ~0.1 s."""
    st = _store_for(_settings(store, None, None, None))
    view = st.get_run(run_id)
    if view.state in ("succeeded", "failed", "cancelled"):
        raise NotResumableError(f"run {run_id} already ended {view.state}",
                                hint="nothing to cancel")
    st.request_cancel(run_id)
