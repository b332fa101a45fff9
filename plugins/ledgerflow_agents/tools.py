"""Tools: plain typed functions with declared permissions, and how a call is checked.

A tool is a function whose parameters have type hints; its JSON schema (what
the model sees) is derived from them, its description from the docstring::

    from pathlib import Path
    from ledgerflow_agents import Arg, tool

    @tool(reads=[Arg("corpus")])
    def read_document(path: Path, *, corpus: str) -> str:
        \"\"\"Read one document of the corpus.

        Args:
            path: the document's path inside the corpus.
        \"\"\"
        return path.read_text()

* **Permissions.** ``reads=`` and ``writes=`` are the roots (folders or files)
  the tool may touch, ``network=`` whether it may open sockets, ``spawn=``
  whether it may start programs. A root is a path or :class:`Arg` naming an
  argument of the agent task (``Arg("corpus")``: the task's ``corpus``).
* **Paths.** A parameter typed ``pathlib.Path`` is a path: a relative one is
  taken inside the tool's first root (its first write root if it writes),
  symlinks and ``..`` are resolved, and one outside every root is refused
  before the tool runs (:class:`~ledgerflow_agents.errors.PathNotAllowed`).
  While it runs, :mod:`ledgerflow_agents.guard` refuses file opens outside
  the roots, sockets and programs the tool did not declare.
* **Hidden parameters.** Keyword-only parameters (after ``*``) are not shown
  to the model: they are filled from the agent task's arguments of the same
  name (or keep their default).

Schemas: ``str``, ``int``, ``float``, ``bool``, ``Path``, ``list[X]``,
``tuple[X, ...]``, ``dict[str, X]``, ``Literal[...]``, ``Enum`` subclasses,
``X | None``, ``Annotated[X, "description"]`` and ``Annotated[X,
msgspec.Meta(max_length=..., ge=..., pattern=...)]`` (constraints a
constrained decoder keeps to, and checked at dispatch).
"""

from __future__ import annotations

import enum
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal, Union, get_args, get_origin

import msgspec

from ledgerflow.errors import DefinitionError
from ledgerflow.keys import code_version

from ._canonical import digest
from .errors import PathNotAllowed
from .provider import ToolSpec

__all__ = ["Arg", "InvalidArguments", "Prepared", "Tool", "as_tool", "tool"]


@dataclass(frozen=True, slots=True)
class Arg:
    """A root taken from the agent task's argument ``name`` when the tool is called
    (plus ``suffix``: ``Arg("index", suffix=".lock")`` is the index's lock file).

    Example:
        >>> Arg("corpus")
        Arg(name='corpus', suffix='')
    """

    name: str
    suffix: str = ""


Root = Union[str, "os.PathLike[str]", Arg]


class InvalidArguments(ValueError):
    """The model's arguments do not fit the tool's schema (the model is told)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checked call: the keyword arguments to pass, and the roots that hold."""

    kwargs: dict[str, Any]
    reads: tuple[str, ...]
    writes: tuple[str, ...]


def _strip(hint: Any) -> tuple[Any, str]:
    """``Annotated[X, "doc"]`` -> (X, "doc")."""
    if get_origin(hint) is typing.Annotated:
        base, *meta = get_args(hint)
        return base, " ".join(m for m in meta if isinstance(m, str))
    return hint, ""


#: msgspec.Meta constraints and their JSON Schema keywords.
_META = {"max_length": "maxLength", "min_length": "minLength", "pattern": "pattern",
         "ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum",
         "description": "description"}


def _constraints(hint: Any) -> dict[str, Any]:
    """JSON Schema keywords of the ``msgspec.Meta`` in ``Annotated[X, Meta(...)]``."""
    out: dict[str, Any] = {}
    if get_origin(hint) is typing.Annotated:
        for m in get_args(hint)[1:]:
            if isinstance(m, msgspec.Meta):
                for attr, keyword in _META.items():
                    value = getattr(m, attr, None)
                    if value is not None:
                        out[keyword] = value
    return out


def _is_optional(hint: Any) -> tuple[bool, Any]:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) < len(get_args(hint)):
            return True, args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
    return False, hint


def schema_of(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one type hint (raises DefinitionError for what has none)."""
    meta = _constraints(hint)
    hint, doc = _strip(hint)
    optional, hint = _is_optional(hint)
    out = {**_schema(_strip(hint)[0], where), **_constraints(hint), **meta}
    if optional:
        out = {"anyOf": [out, {"type": "null"}]}
    if doc:
        out["description"] = doc
    return out


def _schema(hint: Any, where: str) -> dict[str, Any]:
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in simple:
        return {"type": simple[hint]}
    if isinstance(hint, type) and issubclass(hint, PurePath):
        return {"type": "string"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        kinds = {type(a) for a in args}
        out: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and next(iter(kinds)) in simple:
            out["type"] = simple[next(iter(kinds))]
        return out
    if origin in (list, Sequence, tuple) and (origin is not tuple or
                                              (len(args) == 2 and args[1] is Ellipsis)):
        item = args[0] if args else Any
        return {"type": "array", **({"items": schema_of(item, where)} if item is not Any
                                    else {})}
    if origin in (dict, Mapping) and (not args or args[0] is str):
        out = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            out["additionalProperties"] = schema_of(args[1], where)
        return out
    raise DefinitionError(f"{where}: type {hint!r} has no JSON schema here",
                          hint="use str, int, float, bool, Path, list[X], dict[str, X], "
                               "Literal[...] or an Enum")


def _checked(hint: Any) -> Any:
    """The type msgspec checks arguments against (descriptions dropped, Meta kept)."""
    if get_origin(hint) is typing.Annotated:
        base, *extra = get_args(hint)
        metas = [m for m in extra if isinstance(m, msgspec.Meta)]
        return typing.Annotated[(base, *metas)] if metas else base
    return hint


_ARGS_RE = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")


def _docs(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's first paragraph and its ``Args:`` descriptions."""
    doc = inspect.getdoc(fn) or ""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip():
            break
        summary.append(line.strip())
    params: dict[str, str] = {}
    inside, current = False, None
    for line in lines:
        if _ARGS_RE.match(line):
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break
            m = re.match(r"^\s{2,}(\w+)(\s*\(.*?\))?:\s*(.*)$", line)
            if m and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = m.group(1)
                params[current] = m.group(3).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return " ".join(summary), params


class Tool:
    """A function the model may call, with its schema and permissions (see the module doc).

    Calling the tool object calls the function itself (no checks): the agent
    loop checks and dispatches through :meth:`prepare`.
    """

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None,
                 description: str | None = None, reads: Sequence[Root] = (),
                 writes: Sequence[Root] = (), network: bool = False, spawn: bool = False,
                 examples: Sequence[Mapping[str, Any]] = ()) -> None:
        if isinstance(fn, Tool):
            raise DefinitionError(f"{fn!r} is already a tool", hint="apply @tool once")
        if not callable(fn):
            raise DefinitionError(f"a tool must be a function, given: {fn!r}",
                                  hint="decorate a def with @tool")
        self.fn = fn
        self.name = name or fn.__name__
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise DefinitionError(f"tool name {self.name!r} is not a valid tool name",
                                  hint="use letters, digits and _ (at most 64 characters)")
        summary, arg_docs = _docs(fn)
        self.description = description if description is not None else summary
        self.reads = tuple(reads)
        self.writes = tuple(writes)
        self.network = bool(network)
        self.spawn = bool(spawn)
        self.examples = [dict(e) for e in examples]
        where = f"tool {self.name!r}"
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise DefinitionError(f"{where}: its type hints cannot be read: {exc}",
                                  hint="import the types its annotations name") from exc
        sig = inspect.signature(fn)
        props: dict[str, Any] = {}
        required: list[str] = []
        self.visible: list[str] = []
        self.hidden: dict[str, inspect.Parameter] = {}
        self.paths: set[str] = set()
        self.types: dict[str, Any] = {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise DefinitionError(f"{where}: *{p.name} / **{p.name} cannot be described "
                                      "to a model", hint="list the parameters one by one")
            if p.kind == p.KEYWORD_ONLY:
                self.hidden[p.name] = p
                continue
            if p.name not in hints:
                raise DefinitionError(f"{where}: parameter {p.name!r} has no type hint",
                                      hint=f"annotate it, e.g. def {fn.__name__}"
                                           f"({p.name}: str): a tool's schema comes from "
                                           "its type hints")
            hint = hints[p.name]
            schema = schema_of(hint, f"{where}, parameter {p.name!r}")
            if p.name in arg_docs and "description" not in schema:
                schema["description"] = arg_docs[p.name]
            props[p.name] = schema
            base = _is_optional(_strip(hint)[0])[1]
            if isinstance(base, type) and issubclass(base, PurePath):
                self.paths.add(p.name)
            self.types[p.name] = _checked(hint)
            self.visible.append(p.name)
            if p.default is p.empty:
                required.append(p.name)
        if self.paths and not (self.reads or self.writes):
            raise DefinitionError(f"{where} takes a path ({', '.join(sorted(self.paths))}) "
                                  "but declares no roots",
                                  hint="declare where it may read or write: "
                                       "@tool(reads=[...]) or @tool(writes=[...])")
        self.parameters: dict[str, Any] = {"type": "object", "properties": props,
                                           "required": required,
                                           "additionalProperties": False}
        self._signature = sig

    # -- what the model sees -------------------------------------------------------------
    def spec(self) -> ToolSpec:
        """The tool as sent to the model: name, description, JSON schema (and examples)."""
        out: ToolSpec = {"name": self.name, "parameters": self.parameters}
        if self.description:
            out["description"] = self.description
        if self.examples:
            out["examples"] = [dict(e) for e in self.examples]
        return out

    @property
    def version(self) -> str:
        """A hash of the tool's code and declaration (part of the agent task's version)."""
        return digest({"code": code_version(self.fn), "name": self.name,
                       "parameters": self.parameters,
                       "reads": [repr(r) for r in self.reads],
                       "writes": [repr(r) for r in self.writes],
                       "network": self.network, "spawn": self.spawn})[7:23]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tool {self.name}>"

    # -- checking a call -----------------------------------------------------------------
    def roots(self, bound: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The read and write roots, resolved (``Arg``\\ s taken from ``bound``)."""
        def resolve(roots: tuple[Root, ...]) -> tuple[str, ...]:
            out = []
            for r in roots:
                value = bound.get(r.name) if isinstance(r, Arg) else r
                if isinstance(r, Arg) and value is not None and r.suffix:
                    value = os.fspath(value) + r.suffix
                if value is None:
                    raise PathNotAllowed(f"tool {self.name!r}: its root {r!r} has no value",
                                         hint="pass the argument the root names to the "
                                              "agent task")
                out.append(os.path.realpath(os.path.expanduser(os.fspath(value))))
            return tuple(out)
        return resolve(self.reads), resolve(self.writes)

    def prepare(self, arguments: Mapping[str, Any], bound: Mapping[str, Any]) -> Prepared:
        """Check the model's ``arguments`` and build the call's keyword arguments.

        ``bound`` holds the agent task's arguments (for hidden parameters and
        ``Arg`` roots).

        Raises:
            InvalidArguments: unknown, missing or mistyped arguments.
            PathNotAllowed: a path argument outside the tool's roots.
        """
        if not isinstance(arguments, Mapping):
            raise InvalidArguments("the arguments must be a JSON object")
        unknown = sorted(set(arguments) - set(self.visible))
        if unknown:
            raise InvalidArguments(f"unknown argument(s) {', '.join(unknown)}; the tool "
                                   f"takes {', '.join(self.visible) or 'none'}")
        missing = [n for n in self.parameters["required"] if n not in arguments]
        if missing:
            raise InvalidArguments(f"missing argument(s) {', '.join(missing)}")
        reads, writes = self.roots(bound)
        kwargs: dict[str, Any] = {}
        for name in self.visible:
            if name not in arguments:
                continue
            value = arguments[name]
            if name in self.paths and value is not None:
                if not isinstance(value, str) or not value:
                    raise InvalidArguments(f"{name} must be a non-empty path string")
                kwargs[name] = Path(_inside(self.name, value, writes or reads,
                                            reads + writes))
                continue
            try:
                kwargs[name] = msgspec.convert(value, self.types[name], strict=True)
            except (msgspec.ValidationError, TypeError) as exc:
                raise InvalidArguments(f"{name}: {exc}") from None
        for name, p in self.hidden.items():
            if name in bound:
                kwargs[name] = bound[name]
            elif p.default is p.empty:
                raise InvalidArguments(f"hidden parameter {name!r} has no value")
        return Prepared(kwargs, reads, writes)

    def arguments_digest(self, arguments: Mapping[str, Any]) -> str:
        """The digest of a call's canonical arguments (what an approval is bound to)."""
        return digest({"tool": self.name, "arguments": dict(arguments)})


def _inside(tool_name: str, value: str, base: tuple[str, ...], roots: tuple[str, ...]) -> str:
    """``value`` resolved (relative to ``base[0]``); PathNotAllowed outside ``roots``."""
    p = os.path.expanduser(value)
    if not os.path.isabs(p):
        if not base:
            raise PathNotAllowed(f"tool {tool_name!r} has no root for the path {value!r}")
        start = os.path.dirname(base[0]) if os.path.isfile(base[0]) else base[0]
        p = os.path.join(start, p)
    real = os.path.realpath(p)
    if not within(real, roots):
        raise PathNotAllowed(f"tool {tool_name!r} may not touch {value!r} (it resolves to "
                             f"{real}, outside its roots: {', '.join(roots)})")
    return real


def within(path: str, roots: Sequence[str]) -> bool:
    """True if the resolved ``path`` is one of ``roots`` or inside one."""
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@typing.overload
def tool(*, name: str | None = None, description: str | None = None,
         reads: Sequence[Root] = (), writes: Sequence[Root] = (), network: bool = False,
         spawn: bool = False,
         examples: Sequence[Mapping[str, Any]] = ()) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None, reads: Sequence[Root] = (),
         writes: Sequence[Root] = (), network: bool = False, spawn: bool = False,
         examples: Sequence[Mapping[str, Any]] = ()
         ) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a typed function a tool an agent may call; use bare or with permissions.

    Args:
        name: the name the model sees (default: the function's name).
        description: what it does (default: the docstring's first paragraph).
        reads: roots it may read (paths, or ``Arg("task_argument")``).
        writes: roots it may write (and read).
        network: whether it may open sockets (default no).
        spawn: whether it may start programs (default no).
        examples: ``[{"user": "...", "arguments": {...}}]`` few-shot examples
            for small local models.

    Raises:
        DefinitionError: a parameter without a type hint or with a type that
            has no JSON schema, a path parameter without roots, a bad name.

    Example:
        >>> @tool
        ... def add(a: int, b: int) -> int:
        ...     "Add two numbers."
        ...     return a + b
        >>> add.spec()["parameters"]["required"]
        ['a', 'b']
    """
    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, reads=reads, writes=writes,
                    network=network, spawn=spawn, examples=examples)
    return wrap(fn) if fn is not None else wrap


def as_tool(thing: object) -> Tool:
    """``thing`` if it is a Tool, a plain function made into one (no permissions)."""
    if isinstance(thing, Tool):
        return thing
    if callable(thing) and not isinstance(thing, type):
        return Tool(thing)
    raise DefinitionError(f"unknown tool {thing!r}: tools are @tool functions (or plain "
                          "typed functions)", hint="decorate it with @tool, e.g. "
                                                   "@tool(reads=[...])")
