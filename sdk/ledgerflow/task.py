"""The ``@task`` decorator, task options, and the references tracing returns.

Outside a pipeline body a task is a plain function call. Inside one (while
:class:`~ledgerflow.pipeline.Pipeline` traces the body) a call records a node
and returns a :class:`TaskRef`; ``task.map(items)`` records a fan-out and
returns a :class:`MapRef`.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, overload

from .context import current_build
from .errors import DefinitionError, NonRetryableError
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
    verify: Callable[..., object] | None = None

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


@dataclass(frozen=True, slots=True)
class TaskRef:
    """The result of a task call while a pipeline is being traced."""

    key: str

    def __repr__(self) -> str:
        return f"TaskRef({self.key!r})"


@dataclass(frozen=True, slots=True)
class MapRef:
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


class Task(Generic[P, R]):
    """A function made into a pipeline step by :func:`task`."""

    __slots__ = ("__dict__", "_plain", "_version", "fn", "name", "options")

    def __init__(self, fn: Callable[P, R], options: TaskOptions) -> None:
        self.fn = fn
        self.options = options
        self.name: str = options.name or fn.__name__
        self._version: str | None = options.version
        self._plain = fn          # what executors call (no tracing check on the hot path)
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

    def _accepts_after(self) -> bool:
        import inspect
        return "after" in inspect.signature(self.fn).parameters

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
        return (Task, (self.fn, self.options))


@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...
@overload
def task(*, retries: int = 0, retry_delay: float = 0.0, backoff: float = 1.0,
         jitter: float = 0.0, timeout: float | None = None,
         retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
         cache: bool = True, version: str | None = None, name: str | None = None,
         verify: Callable[..., object] | None = None,
         ) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(fn: Callable[P, R] | None = None, /, *, retries: int = 0, retry_delay: float = 0.0,
         backoff: float = 1.0, jitter: float = 0.0, timeout: float | None = None,
         retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
         cache: bool = True, version: str | None = None, name: str | None = None,
         verify: Callable[..., object] | None = None,
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
        verify: for a task whose work is an effect on an outside system (a
            row in an index, a file): before a new run reuses a cached result
            of another run, ``verify(result, *args, **kwargs)`` is called in the
            driver with the task's arguments; the result is reused only if it
            returns True, else (False, or an exception) the task runs again.
            Keep it cheap; successes kept by a resume of the same run are not
            verified again.

    Example:
        >>> @task(retries=2)
        ... def add(a: int, b: int) -> int:
        ...     return a + b
        >>> add(1, 2)
        3
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
    if verify is not None and not callable(verify):
        raise DefinitionError(f"verify must be a function, given: {verify!r}",
                              hint="pass verify=fn with fn(result, *args, **kwargs) -> bool")
    if retry_on is None:
        kinds: tuple[type[BaseException], ...] = (Exception,)
    elif isinstance(retry_on, type):
        kinds = (retry_on,)
    else:
        kinds = tuple(retry_on)
    options = TaskOptions(retries=retries, retry_delay=retry_delay, backoff=backoff,
                          jitter=jitter, timeout=timeout, retry_on=kinds, cache=cache,
                          version=version, name=name, verify=verify)

    def wrap(f: Callable[P, R]) -> Task[P, R]:
        if isinstance(f, Task):
            raise DefinitionError(f"{f.name!r} is already a task",
                                  hint="apply @task once")
        if not callable(f):
            raise DefinitionError(f"@task needs a function, given: {f!r}",
                                  hint="decorate a def")
        return Task(f, options)

    return wrap(fn) if fn is not None else wrap
