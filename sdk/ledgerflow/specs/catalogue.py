"""The tasks a declarative spec can name: how a spec refers to them, and their signatures.

A spec names a task by import path, ``module:attribute`` (an importable
module) or ``path/to/file.py:attribute`` (a module loaded by path; a relative
path is taken from the spec's folder, then from the working directory).
:func:`resolve` turns such a reference into the :class:`~ledgerflow.task.Task`
(or says why it cannot), :func:`find_tasks` builds a :class:`Catalogue` of
every ``@task`` in some modules, packages and files, plus those the installed
plugins offer, and :func:`describe` gives a task's parameters and return type
as :class:`TaskInfo`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import pkgutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from ..errors import InputError
from ..task import Task
from .hints import ANY, hints_of, to_schema
from .hints import describe as describe_type

#: The default of a parameter that has none.
NO_DEFAULT: Final = inspect.Parameter.empty


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a task, as a spec fills it."""

    name: str
    hint: Any
    required: bool
    default: Any = NO_DEFAULT
    #: True if it can take the first positional argument (a fan-out's item).
    positional: bool = True
    #: JSON Schema of the literals it accepts; None: it must come from a step.
    schema: dict[str, Any] | None = None

    @property
    def type_text(self) -> str:
        return describe_type(self.hint)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task's reference, parameters, return type and gate."""

    ref: str
    task: Task[..., Any]
    params: tuple[Param, ...]
    returns: Any
    #: The task takes ``**kwargs``: any argument name is accepted.
    var_kwargs: bool = False
    doc: str = ""

    def param(self, name: str) -> Param | None:
        """The parameter called ``name``, if any."""
        for p in self.params:
            if p.name == name:
                return p
        return None

    @property
    def first(self) -> Param | None:
        """The parameter a fan-out's item goes to (the first positional one)."""
        return self.params[0] if self.params and self.params[0].positional else None

    @property
    def gated(self) -> bool:
        """True if the task asks for approval before its first attempt."""
        return self.task.options.approve is not None

    @property
    def signature(self) -> str:
        """``name(a: int, b: str = 'x') -> list[str]``."""
        parts = []
        for p in self.params:
            text = f"{p.name}: {p.type_text}"
            if not p.required:
                text += f" = {p.default!r}"
            parts.append(text)
        if self.var_kwargs:
            parts.append("**kwargs")
        return f"{self.ref.rpartition(':')[2]}({', '.join(parts)}) -> {describe_type(self.returns)}"


_INFO: dict[int, TaskInfo] = {}


def describe(t: Task[..., Any], ref: str) -> TaskInfo:
    """The parameters and return type of ``t`` (a ``@task`` or a program task)."""
    found = _INFO.get(id(t))
    if found is not None and found.task is t and found.ref == ref:
        return found
    spec = getattr(t, "spec", None)
    placeholders = getattr(spec, "placeholders", None)
    if callable(placeholders):          # a program task: its parameters are its placeholders
        params = tuple(Param(n, ANY, True, schema={}) for n in sorted(placeholders()))
        from ..programs import ProgramResult
        info = TaskInfo(ref, t, params, ProgramResult, var_kwargs=True,
                        doc=f"runs {' '.join(getattr(spec, 'argv', ()))}")
    else:
        fn = t.fn
        hints = hints_of(fn)
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = inspect.Signature()
        out: list[Param] = []
        var_kw = False
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
                continue
            if p.kind is p.VAR_POSITIONAL or p.name == "after":
                continue
            if p.kind is p.POSITIONAL_ONLY:
                positional = True
            else:
                positional = p.kind is p.POSITIONAL_OR_KEYWORD
            hint = hints.get(p.name, ANY)
            out.append(Param(p.name, hint, p.default is p.empty, p.default, positional,
                             to_schema(hint)))
        returns = hints.get("return", ANY)
        doc = (inspect.getdoc(fn) or "").strip().split("\n", 1)[0]
        info = TaskInfo(ref, t, tuple(out), returns, var_kw, doc)
    _INFO[id(t)] = info
    return info


# -- references ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Unresolved:
    """Why a reference names no task: a problem code, a message and a hint."""

    code: str
    message: str
    hint: str


def _module_by_path(mod: str, folder: str | None) -> ModuleType:
    from .modules import load_module
    candidates = [Path(mod)] if os.path.isabs(mod) else \
        [*([Path(folder) / mod] if folder else []), Path(mod)]
    for c in candidates:
        if c.is_file():
            module: ModuleType = load_module(c)
            return module
    raise FileNotFoundError(mod)


def find_module(name: str, folder: str | None = None) -> ModuleType | Unresolved:
    """The module a reference names (``mypkg.steps``, or ``steps.py`` from ``folder``),
    imported; or why it cannot be (its message leaves the reference to the caller)."""
    try:
        if name.endswith(".py"):
            return _module_by_path(name, folder)
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
        return importlib.import_module(name)
    except FileNotFoundError:
        return Unresolved("task.unknown", f"no file {name!r}",
                          "give the file's path relative to the spec's folder")
    except InputError as exc:
        return Unresolved("task.unknown", str(exc), exc.hint or "fix the module")
    except ImportError as exc:
        return Unresolved("task.unknown", f"cannot import {name!r} ({exc})",
                          "check the module name, or use a file path: 'file.py:function'")
    except Exception as exc:        # the user's module failed while importing
        return Unresolved("task.unknown", f"importing {name!r} failed: "
                          f"{type(exc).__name__}: {exc}", "fix the module's import-time error")


def resolve(ref: str, folder: str | None = None,
            modules: dict[str, ModuleType | Unresolved] | None = None
            ) -> Task[..., Any] | Unresolved:
    """The task ``ref`` names (``module:attr`` or ``file.py:attr``), or why there is none.

    ``modules``: the modules found so far, by name (one check of a spec passes
    the same dict for every step, so each module is looked up once).

    Example:
        >>> isinstance(resolve("nowhere"), Unresolved)
        True
    """
    mod_name, _, attr = ref.rpartition(":")
    if not mod_name or not attr:
        return Unresolved("task.bad_path", f"import path {ref!r} must look like "
                          "'module:function' or 'file.py:function'",
                          "e.g. task = \"mypkg.steps:load\"")
    found = modules.get(mod_name) if modules is not None else None
    if found is None:
        found = find_module(mod_name, folder)
        if modules is not None:
            modules[mod_name] = found
    if isinstance(found, Unresolved):
        return Unresolved(found.code, f"{ref!r}: {found.message}", found.hint)
    module = found
    obj = getattr(module, attr, None)
    if obj is None:
        near = difflib.get_close_matches(attr, tasks_of(module), n=3)
        hint = ("did you mean " + " or ".join(f"'{mod_name}:{n}'" for n in near) + "?") \
            if near else "its tasks are: " + (", ".join(tasks_of(module)) or "none")
        return Unresolved("task.unknown", f"{ref!r}: {mod_name!r} has no attribute {attr!r}",
                          hint)
    if not isinstance(obj, Task):
        kind = "a plain function" if callable(obj) else type(obj).__name__
        return Unresolved("task.not_a_task", f"{ref!r} is {kind}, not a @task",
                          "decorate it with @task, or name a task")
    return obj


def tasks_of(module: ModuleType) -> list[str]:
    """Names of the ``@task`` objects a module defines (not those it imports)."""
    names = []
    for name, obj in vars(module).items():
        if isinstance(obj, Task) and not name.startswith("_") \
                and getattr(obj, "__module__", module.__name__) == module.__name__:
            names.append(name)
    return names


def module_ref(module: ModuleType, base: str | os.PathLike[str] | None = None) -> str:
    """How a spec names ``module``: its import name, or its file's path for a module
    loaded by path (relative to ``base`` when it is inside it)."""
    path = getattr(module, "__ledgerflow_file__", None)
    if not path:
        return module.__name__
    if base is not None:
        rel = os.path.relpath(path, os.path.abspath(base))
        if not rel.startswith(".."):
            return Path(rel).as_posix()
    return Path(path).as_posix()


# -- catalogues ------------------------------------------------------------------------

@dataclass(slots=True)
class Catalogue:
    """The tasks found, by reference, and what could not be read (as warnings)."""

    tasks: dict[str, TaskInfo] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tasks)

    def short_names(self) -> dict[str, str]:
        """A unique short name per task (its attribute name, module-qualified on clashes)."""
        by_attr: dict[str, list[str]] = {}
        for ref in self.tasks:
            by_attr.setdefault(ref.rpartition(":")[2], []).append(ref)
        out: dict[str, str] = {}
        for attr, refs in by_attr.items():
            if len(refs) == 1:
                out[refs[0]] = attr
                continue
            for ref in refs:
                mod = Path(ref.rpartition(":")[0]).stem.replace(".", "_")
                out[ref] = f"{mod}_{attr}"
        return out

    def add_module(self, module: ModuleType, base: str | None) -> None:
        prefix = module_ref(module, base)
        for name in tasks_of(module):
            ref = f"{prefix}:{name}"
            if ref not in self.tasks:
                self.tasks[ref] = describe(getattr(module, name), ref)


def _load(source: str) -> list[ModuleType]:
    """The module (or a package's modules) ``source`` names: a dotted name or a file."""
    from .modules import load_module
    if source.endswith(".py") or os.sep in source or Path(source).is_file():
        return [load_module(source)]
    try:
        module = importlib.import_module(source)
    except ImportError as exc:
        raise InputError(f"cannot import {source!r} for its tasks: {exc}",
                         hint="pass an importable module or package, or a .py file") from None
    found = [module]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, module.__name__ + "."):
            try:
                found.append(importlib.import_module(info.name))
            except Exception as exc:    # one broken submodule must not hide the rest
                raise InputError(f"importing {info.name} (in package {source}) failed: "
                                 f"{type(exc).__name__}: {exc}",
                                 hint="fix that module, or pass the modules you need "
                                 "one by one") from None
    return found


def find_tasks(sources: Iterable[str] = (), *, base: str | None = None,
               plugins: bool = True) -> Catalogue:
    """Every ``@task`` in ``sources`` (modules, packages, ``.py`` files) and the plugins.

    Args:
        sources: dotted module or package names, or paths of ``.py`` files.
        base: the folder a spec will live in: file modules are named relative to it.
        plugins: also the tasks of registered plugin modules and those named by
            the ``ledgerflow_spec_tasks`` hook.

    Raises:
        InputError: a source cannot be imported.
    """
    cat = Catalogue()
    for source in sources:
        for module in _load(source):
            cat.add_module(module, base)
    if plugins:
        from ..plugins import get_plugin_manager
        pm = get_plugin_manager()
        for _name, plugin in pm.list_name_plugin():
            if isinstance(plugin, ModuleType):
                cat.add_module(plugin, base)
        names: Sequence[str] = [n for ns in pm.hook.ledgerflow_spec_tasks() for n in ns]
        for source in names:
            try:
                for module in _load(source):
                    cat.add_module(module, base)
            except InputError as exc:
                cat.warnings.append(f"plugin tasks {source!r} skipped: {exc}")
    return cat
