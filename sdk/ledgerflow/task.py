"""The ``@task`` decorator, task options, and the references tracing returns.

Outside a pipeline body a task is a plain function call. Inside one (while
:class:`~ledgerflow.pipeline.Pipeline` traces the body) a call records a node
and returns a :class:`TaskRef`; ``task.map(items)`` records a fan-out and
returns a :class:`MapRef`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, ParamSpec, TypeVar, overload

from .approval import Approval, gate_of
from .context import current_build
from .errors import DefinitionError, NonRetryableError, PipelineBodyError
from .keys import code_version

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOptions:
    """How a task is retried, timed out and cached.

    ``jitter`` is a fraction: each retry delay is multiplied by a random factor
    in ``[1 - jitter, 1 + jitter]``.
    """

    retries: int = 0
    retry_delay: float = 0.0
    backoff: float = 1.0
    jitter: float = 0.0
    timeout: float | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    cache: bool = True
    version: str | None = None
    name: str | None = None
    #: A gate before the task's first attempt (see :mod:`ledgerflow.approval`).
    approve: Approval | None = None
    #: A check of a cache hit from another run (see :func:`task`).
    verify: Callable[..., object] | None = None
    #: The task acts on the world (writes outside its result, calls out): its start is
    #: always committed before it runs, never within the commit lag (see :func:`task`).
    side_effects: bool = False

    @property
    def durable_start(self) -> bool:
        """True if an attempt's ``running`` must be committed before the attempt starts
        (see :attr:`ledgerflow.config.Settings.commit_lag`): side effects, retries that
        count lost attempts, a gate, or a timeout."""
        return (self.side_effects or self.retries > 0 or self.approve is not None
                or self.timeout is not None)

    @classmethod
    def from_arguments(cls, *, retries: int = 0, retry_delay: float = 0.0, backoff: float = 1.0,
                       jitter: float = 0.0, timeout: float | None = None,
                       retry_on: type[BaseException] | Sequence[type[BaseException]] | None
                       = None, **rest: Any) -> TaskOptions:
        """Options from the keyword arguments of ``@task`` (or ``program()``), checked once.

        ``retry_on`` may be one exception type, several, or None (any ``Exception``);
        the other keywords (``cache``, ``version``, ...) are passed on as they are.
        """
        if retries < 0:
            raise DefinitionError(f"retries must be 0 or more, given: {retries}",
                                  hint="use retries=0 for a single attempt")
        if timeout is not None and timeout <= 0:
            raise DefinitionError(f"timeout must be positive, given: {timeout}",
                                  hint="pass timeout=None for no limit")
        if not 0.0 <= jitter <= 1.0:
            raise DefinitionError(f"jitter must be between 0 and 1, given: {jitter}",
                                  hint="jitter is a fraction of the delay, e.g. jitter=0.1")
        if retry_on is None:
            kinds: tuple[type[BaseException], ...] = (Exception,)
        elif isinstance(retry_on, type):
            kinds = (retry_on,)
        else:
            kinds = tuple(retry_on)
        return cls(retries=retries, retry_delay=retry_delay, backoff=backoff, jitter=jitter,
                   timeout=timeout, retry_on=kinds, **rest)

    def delay(self, failures: int, rand: float) -> float:
        """Seconds to wait before the next attempt after ``failures`` failures."""
        base = self.retry_delay * (self.backoff ** max(failures - 1, 0))
        return max(0.0, base * (1.0 + self.jitter * (2.0 * rand - 1.0)))

    def retryable(self, exc: BaseException | None) -> bool:
        """True if an attempt that raised ``exc`` may be retried."""
        if exc is None:
            return True
        if isinstance(exc, NonRetryableError):
            return False
        return isinstance(exc, self.retry_on)


def _in_event_loop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Call an ``async def`` task to completion (a fresh event loop per attempt).

    When a loop already runs in this thread (a notebook's), the coroutine runs
    in a helper thread with this thread's context (run id, output capture).
    """
    import asyncio  # here, not at the top: ~20 ms (ssl, subprocess) on every import
    import concurrent.futures

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        coro = fn(*args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        ctx = contextvars.copy_context()
        with concurrent.futures.ThreadPoolExecutor(1, "ledgerflow-async") as pool:
            return pool.submit(ctx.run, asyncio.run, coro).result()
    return call


def _misuse(ref: Any, what: str) -> DefinitionError:
    """The error for using a reference as if it were a value, at the user's line."""
    frame = sys._getframe(2)
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    kind = "fan-out" if isinstance(ref, MapRef) else "task"
    return PipelineBodyError(
        f"{what} on the result of {kind} {ref.key!r} in the pipeline body ({where}): "
        "while the body is traced, task results are references, not values yet",
        hint="do it inside a task, e.g. @task def step(x): return x + 1, and pass the "
        "result to it", where=where)


class _NotAValue:
    """Operations a pipeline body cannot do on a task result: each raises, naming the line."""

    __slots__ = ()

    def __bool__(self) -> bool:
        raise _misuse(self, "a truth test (if/and/or/not)")

    def __iter__(self) -> Any:
        raise _misuse(self, "iterating")

    def __len__(self) -> int:
        raise _misuse(self, "len()")

    def __getitem__(self, item: Any) -> Any:
        raise _misuse(self, f"indexing [{item!r}]")

    def __contains__(self, item: Any) -> bool:
        raise _misuse(self, "'in'")

    def __lt__(self, other: Any) -> bool:
        raise _misuse(self, "a comparison")

    __le__ = __gt__ = __ge__ = __lt__

    def __add__(self, other: Any) -> Any:
        raise _misuse(self, "arithmetic")

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __add__
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __add__
    __matmul__ = __and__ = __or__ = __xor__ = __add__

    def __neg__(self) -> Any:
        raise _misuse(self, "arithmetic")

    def __int__(self) -> int:
        raise _misuse(self, "int()")

    def __float__(self) -> float:
        raise _misuse(self, "float()")

    def __index__(self) -> int:
        raise _misuse(self, "use as a number")

    def __format__(self, spec: str) -> str:
        raise _misuse(self, "formatting into text (f-string)")


@dataclass(frozen=True, slots=True, eq=True)
class TaskRef(_NotAValue):
    """The result of a task call while a pipeline is being traced."""

    key: str

    def __repr__(self) -> str:
        return f"TaskRef({self.key!r})"


@dataclass(frozen=True, slots=True, eq=True)
class MapRef(_NotAValue):
    """The results of a ``.map`` fan-out (a list, in item order)."""

    key: str

    def __repr__(self) -> str:
        return f"MapRef({self.key!r})"


_WHERE: dict[tuple[str, int], str] = {}


def _where(frame: types.FrameType) -> str:
    """``file:line`` of a call site, one shared string per site (a loop of
    100,000 calls keeps one copy)."""
    site = (frame.f_code.co_filename, frame.f_lineno)
    text = _WHERE.get(site)
    if text is None:
        text = _WHERE[site] = f"{site[0]}:{site[1]}"
    return text


_ANY_CALL = ()


def _call_shape(fn: Callable[..., Any]) -> tuple[Any, ...]:
    """(positional names, max positional, required positional count, required names,
    keyword names, accepts **kwargs) of ``fn``; ``_ANY_CALL`` when it takes anything."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return _ANY_CALL
    kinds = inspect.Parameter
    names: list[str] = []
    required: list[str] = []
    kw_ok: set[str] = set()
    max_pos, any_kw, required_pos = 0, False, 0
    for p in sig.parameters.values():
        if p.kind is kinds.VAR_POSITIONAL:
            max_pos = 1 << 30
        elif p.kind is kinds.VAR_KEYWORD:
            any_kw = True
        elif p.kind is kinds.POSITIONAL_ONLY:
            names.append(p.name)
            max_pos += 1
            if p.default is p.empty:
                required.append(p.name)
                required_pos = len(names)
        else:
            if p.kind is kinds.POSITIONAL_OR_KEYWORD:
                names.append(p.name)
                max_pos += 1
            if p.name != "after":
                kw_ok.add(p.name)
            if p.default is p.empty:
                required.append(p.name)
                if p.kind is kinds.POSITIONAL_OR_KEYWORD:
                    required_pos = len(names)
    if max_pos >= 1 << 30 and any_kw and not required:
        return _ANY_CALL
    if any(r not in names for r in required):      # a keyword-only parameter is required
        required_pos = 1 << 30
    return (tuple(names), max_pos, required_pos, tuple(required), frozenset(kw_ok), any_kw)


class Task(Generic[P, R]):
    """A function made into a pipeline step by :func:`task`."""

    __slots__ = ("__dict__", "_plain", "_version", "fn", "name", "options")

    def __init__(self, fn: Callable[P, R], options: TaskOptions) -> None:
        self.fn = fn
        self.options = options
        self.name: str = options.name or fn.__name__
        self._version: str | None = options.version
        # what executors call (no tracing check on the hot path); a coroutine function
        # runs to completion in an event loop of its own, once per attempt
        self._plain = _in_event_loop(fn) if inspect.iscoroutinefunction(fn) else fn
        functools.update_wrapper(self, fn)

    @property
    def version(self) -> str:
        """The code version: ``version=`` if given, else a hash of the source."""
        if self._version is None:
            self._version = code_version(self.fn)
        return self._version

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        build = current_build.get()
        if build is None:
            if "after" in kwargs and not self._accepts_after():
                kwargs.pop("after")
            return self.fn(*args, **kwargs)
        after = kwargs.pop("after", None)
        return build.add_call(self, args, kwargs, after,  # type: ignore[return-value]
                              _where(sys._getframe(1)))

    def map(self, items: object, /, *, key: str | Callable[[Any], object] | None = None,
            after: Sequence[object] | None = None, **broadcast: object) -> list[R]:
        """Fan out: one task per item of ``items``, keyed by a stable item key.

        Args:
            items: a list, a reference to a task returning a list, or another
                ``.map`` (then the fan-out is element-wise and keeps its keys).
            key: a dict field name or a callable giving each item's key;
                default: the item itself for str/int, else its content hash.
            after: references that must finish first (no data passed).
            **broadcast: extra keyword arguments passed to every child.

        Example:
            >>> @task
            ... def double(x: int) -> int:
            ...     return 2 * x
            >>> double.map([1, 2, 3])
            [2, 4, 6]
        """
        build = current_build.get()
        if build is None:
            return [self.fn(item, **broadcast) for item in items]  # type: ignore[arg-type, attr-defined]
        return build.add_map(self, items, key, broadcast, after,  # type: ignore[return-value]
                             _where(sys._getframe(1)))

    def _extra_fingerprint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """Bytes this task adds to one call's fingerprint (default: none).

        The runner appends them to the literal arguments before hashing, in the
        driver, before the cache is consulted; a subclass overrides it to cover
        what the arguments do not show (e.g. the contents of input files). It
        must not raise: describe an unreadable input in the bytes instead.
        """
        return b""

    def _accepts_after(self) -> bool:
        return "after" in inspect.signature(self.fn).parameters

    def call_problem(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why ``args``/``kwargs`` cannot bind to the function's signature, or None.

        Checked while tracing, so ``add(double(x))`` for ``add(a, b)`` is refused
        before anything runs. The shape of the signature is computed once per task.
        """
        shape = self.__dict__.get("_shape")
        if shape is None:
            shape = self.__dict__["_shape"] = _call_shape(self.fn)
        if shape is _ANY_CALL:
            return None
        names, max_pos, required_pos, required, kw_ok, any_kw = shape
        n = len(args)
        if not kwargs and required_pos <= n <= max_pos:
            return None                         # the common case: positional only
        if n > max_pos:
            return f"takes {max_pos} positional arguments but {n} were given"
        given = set(names[:n])
        for k in kwargs:
            if k in given:
                return f"got multiple values for argument {k!r}"
            if not any_kw and k not in kw_ok:
                return f"got an unexpected keyword argument {k!r}"
        missing = [k for k in required if k not in given and k not in kwargs]
        if missing:
            return "missing required argument" + ("s " if len(missing) > 1 else " ") \
                + ", ".join(repr(k) for k in missing)
        return None

    def __repr__(self) -> str:
        return f"<task {self.name}>"

    def __reduce__(self) -> str | tuple[Any, ...]:
        # By reference when the module exposes this very task; else by value
        # (cloudpickle then ships the function's code, e.g. from a notebook).
        module = sys.modules.get(getattr(self, "__module__", ""), None)
        if module is not None and module.__name__ != "__main__" \
                and not getattr(module, "__ledgerflow_file__", None) and getattr(
                module, getattr(self, "__qualname__", ""), None) is self:
            return str(self.__qualname__)
        # verify runs in the driver only: a worker never needs it (nor its globals)
        options = self.options if self.options.verify is None else replace(self.options,
                                                                            verify=None)
        return (Task, (self.fn, options))


@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...
@overload
def task(*, retries: int = 0, retry_delay: float = 0.0, backoff: float = 1.0,
         jitter: float = 0.0, timeout: float | None = None,
         retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
         cache: bool = True, version: str | None = None,
         name: str | None = None,
         approve: bool | Approval | None = None,
         verify: Callable[..., object] | None = None,
         side_effects: bool = False,
         ) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(fn: Callable[P, R] | None = None, /, *, retries: int = 0, retry_delay: float = 0.0,
         backoff: float = 1.0, jitter: float = 0.0, timeout: float | None = None,
         retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
         cache: bool = True, version: str | None = None,
         name: str | None = None,
         approve: bool | Approval | None = None,
         verify: Callable[..., object] | None = None,
         side_effects: bool = False,
         ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Make a function a task; use bare or with options.

    Args:
        retries: extra attempts after the first (0 = one attempt).
        retry_delay: seconds before the first retry.
        backoff: multiplier of the delay for each further retry.
        jitter: random fraction (0..1) applied to each delay.
        timeout: seconds an attempt may take; then it is abandoned.
        retry_on: exception types worth retrying (default: any Exception;
            :class:`NonRetryableError` never is).
        cache: reuse a committed result with the same fingerprint.
        version: pin the code version instead of hashing the source.
        name: the task name (default: the function name).
        approve: ask a person before the first attempt: ``True`` or an
            ``Approval(timeout=..., on_timeout="fail"|"reject", approvers=[...])``.
        verify: for a task whose work is an effect on an outside system (a
            row in an index, a file): before a new run reuses a cached result
            of another run, ``verify(result, *args, **kwargs)`` is called in the
            driver with the task's arguments; the result is reused only if it
            returns True, else (False, or an exception) the task runs again.
            Keep it cheap; successes kept by a resume of the same run are not
            verified again.
        side_effects: the task acts on the world (sends, writes outside its
            result): an in-driver attempt of it starts only once its ``running``
            is committed, so a crash never repeats it unseen (plain tasks may
            start within the commit lag, ``Settings.commit_lag``).

    Example:
        >>> @task(retries=2)
        ... def add(a: int, b: int) -> int:
        ...     return a + b
        >>> add(1, 2)
        3
    """
    if verify is not None and not callable(verify):
        raise DefinitionError(f"verify must be a function, given: {verify!r}",
                              hint="pass verify=fn with fn(result, *args, **kwargs) -> bool")
    options = TaskOptions.from_arguments(
        retries=retries, retry_delay=retry_delay, backoff=backoff, jitter=jitter,
        timeout=timeout, retry_on=retry_on, cache=cache, version=version, name=name,
        approve=gate_of(approve), verify=verify, side_effects=side_effects)

    def wrap(f: Callable[P, R]) -> Task[P, R]:
        if isinstance(f, Task):
            raise DefinitionError(f"{f.name!r} is already a task",
                                  hint="apply @task once")
        if not callable(f):
            raise DefinitionError(f"@task needs a function, given: {f!r}",
                                  hint="decorate a def")
        return Task(f, options)

    return wrap(fn) if fn is not None else wrap
