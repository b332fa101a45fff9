"""``@pipeline``: trace a function body into a :class:`~ledgerflow.graph.Graph`.

While the body runs, task calls record nodes instead of executing. The body
may run again, with the same parameters, when a run is resumed in a new
process (a big run's recorded graph spares that: :mod:`ledgerflow.recipe`), so
it must be deterministic (no reading of files or clocks there: put that in
tasks).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from ._gc import quiet_gc
from .context import current_build
from .errors import (
    DefinitionError,
    MissingInputError,
    ParameterBindError,
    PipelineBodyError,
    PipelineError,
)
from .graph import REF_TYPES, Graph, Node
from .task import MapRef, Task, TaskRef

if TYPE_CHECKING:
    from .launch import Run
    from .opening import StoreArg

P = ParamSpec("P")
R = TypeVar("R")

RUN_OPTIONS = frozenset({"store", "executor", "workers", "fail_fast", "wait", "settings",
                         "run_id", "progress", "graph", "logs"})

#: The keyword arguments of every call that has none (never mutated): one empty
#: dict per call would cost 64 bytes a task.
_NO_KWARGS: dict[str, Any] = {}


class Build:
    """Records the nodes of one trace of a pipeline body."""

    __slots__ = ("counts", "graph")

    def __init__(self, name: str) -> None:
        self.graph = Graph(name)
        self.counts: dict[str, int] = {}

    def _key(self, name: str) -> str:
        n = self.counts.get(name, 0) + 1
        self.counts[name] = n
        return name if n == 1 else f"{name}-{n}"

    def _scan(self, values: Sequence[Any], deps: list[str]) -> bool:
        found = False
        for v in values:
            t = type(v)
            if t is TaskRef or t is MapRef:
                deps.append(v.key)
                found = True
            elif t is list or t is tuple:
                found = self._scan(v, deps) or found
            elif t is dict:
                found = self._scan(list(v.values()), deps) or found
        return found

    def _after(self, key: str, after: object) -> tuple[str, ...]:
        if after is None:
            return ()
        items = after if isinstance(after, (list, tuple)) else [after]
        keys = []
        for a in items:
            if isinstance(a, REF_TYPES):
                keys.append(a.key)
            elif isinstance(a, Task):
                self.graph.problems.append(
                    f"task {key!r} has after={a.name} (a task, not a call result); "
                    f"call it first and pass the result: x = {a.name}(...)")
            else:
                self.graph.problems.append(
                    f"task {key!r} has after={a!r}; after= takes results of task calls")
        return tuple(keys)

    def add_call(self, t: Task[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 after: object, where: str) -> TaskRef:
        key = self._key(t.name)
        problem = t.call_problem(args, kwargs)
        if problem is not None:
            self.graph.problems.append(f"{where}: {t.name}() {problem}; "
                                       f"its signature is {t.name}{_signature(t)}")
        deps: list[str] = []
        has_refs = self._scan(args, deps) | self._scan(list(kwargs.values()), deps)
        node = Node(key, t, False, args, kwargs or _NO_KWARGS,
                    tuple(dict.fromkeys(deps)) if len(deps) > 1 else tuple(deps),
                    self._after(key, after) if after is not None else (), where=where,
                    has_refs=has_refs)
        self.graph.nodes[key] = node
        return TaskRef(key)

    def add_map(self, t: Task[..., Any], items: object, item_key: Any,
                broadcast: dict[str, Any], after: object, where: str) -> MapRef:
        key = self._key(t.name)
        if isinstance(items, Task) or (callable(items) and not isinstance(items, REF_TYPES)):
            self.graph.problems.append(
                f"{key}.map() was given {items!r}, a callable; pass a list or a task result")
            items = []
        elif not isinstance(items, (*REF_TYPES, list, tuple)):
            try:
                items = list(items)  # type: ignore[call-overload]
            except TypeError:
                self.graph.problems.append(
                    f"{key}.map() needs a list or a task result, given {type(items).__name__}")
                items = []
        problem = t.call_problem((None,), broadcast)
        if problem is not None:
            self.graph.problems.append(f"{where}: {t.name}.map() calls {t.name}(item, ...), "
                                       f"which {problem}; its signature is "
                                       f"{t.name}{_signature(t)}")
        deps: list[str] = []
        has_refs = self._scan(list(broadcast.values()), deps)
        if isinstance(items, tuple):
            items = list(items)
        if isinstance(items, list):
            inner: list[str] = []
            if self._scan(items, inner):
                self.graph.problems.append(
                    f"{key}.map() items hold task results; pass one task's list result instead")
        node = Node(key, t, True, (), broadcast, tuple(dict.fromkeys(deps)),
                    self._after(key, after), source=items, item_key=item_key, where=where,
                    has_refs=has_refs)
        self.graph.nodes[key] = node
        return MapRef(key)


class Pipeline(Generic[P, R]):
    """A traced function whose task calls form a DAG; see :func:`pipeline`."""

    #: The graph is the trace of ``fn`` (a recorded graph may stand for a new trace).
    traced: bool = True

    def __init__(self, fn: Callable[P, R], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.signature = inspect.signature(fn)
        clash = RUN_OPTIONS.intersection(self.signature.parameters)
        if clash:
            raise DefinitionError(
                f"pipeline {self.name!r} has parameter {sorted(clash)[0]!r}, a run option name",
                hint="rename that parameter")
        functools.update_wrapper(self, fn)

    def target(self) -> str | None:
        """The target that loads this pipeline again, in this or another process.

        ``FILE.py:NAME`` for a module loaded by path or a script, ``module:NAME``
        for an importable module, ``__main__:NAME`` in a notebook or REPL (only
        that process can resume the run).
        """
        mod = sys.modules.get(self.fn.__module__)
        path = getattr(mod, "__file__", None)
        if mod is not None and getattr(mod, "__ledgerflow_file__", None):
            return f"{mod.__ledgerflow_file__}:{self.name}"
        if self.fn.__module__ == "__main__":
            return f"{os.path.abspath(path)}:{self.name}" if path else f"__main__:{self.name}"
        if mod is not None:
            return f"{self.fn.__module__}:{self.name}"
        return None

    def admit(self, store: Any) -> None:
        """Raise a PipelineError to refuse starting or resuming a run in ``store``.

        Called before anything of the run is recorded. Every pipeline is admitted;
        a spec file written by ``pipeline draft`` is refused until its digest is
        approved (:meth:`ledgerflow.specs.pipeline.SpecPipeline.admit`).
        """
        return None

    def bind(self, *args: Any, **params: Any) -> dict[str, Any]:
        """Check ``params`` against the signature; return all parameters by name."""
        try:
            self.signature.bind_partial(*args, **params)
        except TypeError:
            pass        # reported below, with the signature
        else:
            given = set(self.signature.bind_partial(*args, **params).arguments)
            missing = [n for n, p in self.signature.parameters.items()
                       if p.default is inspect.Parameter.empty and n not in given
                       and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            if missing:
                raise MissingInputError(
                    f"pipeline {self.name!r} needs parameter {missing[0]!r}; signature is "
                    f"{self.name}{self.signature}",
                    hint=f"pass it: -p {missing[0]}=... (or {self.name}.run({missing[0]}=...))")
        try:
            bound = self.signature.bind(*args, **params)
        except TypeError as exc:
            raise ParameterBindError(
                f"pipeline {self.name!r}: {exc}; signature is {self.name}{self.signature}",
                hint=f"pass the parameters of {self.name}{self.signature}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def build(self, *args: Any, **params: Any) -> Graph:
        """Trace the body with ``params`` and return the validated graph.

        Example:
            >>> from ledgerflow import task, pipeline
            >>> @task
            ... def one() -> int: return 1
            >>> @pipeline
            ... def p(): return one()
            >>> list(p.build().nodes)
            ['one']
        """
        values = self.bind(*args, **params)
        build = Build(self.name)
        token = current_build.set(build)
        try:
            with quiet_gc():
                build.graph.output = self.fn(**values)  # type: ignore[call-arg]
        except PipelineError:
            raise
        except Exception as exc:    # the user's body failed: their mistake, at their line
            where = _body_line(exc, self.fn)
            raise PipelineBodyError(
                f"the body of pipeline {self.name!r} raised {type(exc).__name__}: {exc}"
                + (f" ({where})" if where else ""),
                hint="fix the pipeline body (run with --debug for the traceback)",
                where=where) from exc
        finally:
            current_build.reset(token)
        return build.graph.validate()

    def run(self, *args: Any, store: StoreArg = None, executor: object = None,
            workers: int | None = None, fail_fast: bool | None = None,
            wait: bool = True, run_id: str | None = None, progress: Any = None,
            logs: bool | None = None, **params: Any) -> Run:
        """Start a run of this pipeline and return its :class:`~ledgerflow.launch.Run`.

        With ``wait=False`` the run is driven in a background thread. With
        ``logs=True`` what tasks write is also echoed to stderr as it is written
        (it is always kept per attempt: ``run.logs(task_key)``).
        """
        from .launch import start
        return start(self, args, params, store=store, executor=executor, workers=workers,
                     fail_fast=fail_fast, wait=wait, run_id=run_id, progress=progress,
                     logs=logs)

    def graph(self, *args: Any, **params: Any) -> Graph:
        """Return the static graph for ``params`` (alias of :meth:`build`)."""
        return self.build(*args, **params)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if current_build.get() is not None:     # a sub-pipeline: inline its tasks
            values = self.bind(*args, **kwargs)
            return self.fn(**values)  # type: ignore[call-arg]
        run: Any = self.run
        return run(*args, **kwargs).result()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<pipeline {self.name}>"

    def _repr_html_(self) -> str:
        from .display import graph_html
        return graph_html(self.build())


def _signature(t: Task[..., Any]) -> str:
    """The parameters of ``t``'s function without annotations: ``(a, b=1, *, c)``."""
    try:
        sig = inspect.signature(t.fn)
    except (TypeError, ValueError):
        return "(...)"
    bare = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=sig.empty))


def _body_line(exc: BaseException, fn: Callable[..., Any]) -> str:
    """``file:line`` of the deepest frame of ``exc`` in the body's own file."""
    filename = getattr(getattr(fn, "__code__", None), "co_filename", None)
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            where = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def pipeline(fn: Callable[P, R] | None = None, /, *,
             name: str | None = None) -> Any:
    """Make a function a pipeline: its task calls build the DAG.

    Example:
        >>> from ledgerflow import task, pipeline
        >>> @task
        ... def inc(x: int) -> int: return x + 1
        >>> @pipeline
        ... def two(x: int = 0):
        ...     return inc(inc(x))
        >>> len(two.build())
        2
    """
    if fn is None:
        return lambda f: Pipeline(f, name)
    return Pipeline(fn, name)
