"""Code versions, content hashes and fingerprints.

A task's *code version* hashes its own source (or, when the source cannot be
found, as for some notebook cells, its compiled code). A *fingerprint* is
``hash(task name, code version, literal arguments, upstream content hashes)``;
equal fingerprints mean a committed result can be reused.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import pickle
import textwrap
import types
from collections.abc import Callable, Iterable
from typing import Any

_SIMPLE = (str, int, float, bool, type(None))


def digest(data: bytes) -> str:
    """Return the 32-hex-digit content hash used everywhere in the ledger."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def idempotency_key(run_id: str, task_key: str) -> str:
    """The idempotency key of a task in a run (see ``RunContext.idempotency_key``)."""
    return digest((run_id + "\x00" + task_key).encode())


def code_version(fn: Callable[..., Any]) -> str:
    """Hash the code of ``fn``: its syntax tree, without decorators and docstring.

    Comments, blank lines and formatting do not change it. Falls back to the
    compiled code object when no source is available (some notebook cells).
    Covers only the function's own body: helpers it calls, globals it reads
    and installed libraries are not included; pass ``version=`` to pin it.

    Example:
        >>> def f(x): return x + 1
        >>> len(code_version(f))
        16
    """
    try:
        data = _tree_bytes(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, ValueError):
        code = getattr(fn, "__code__", None)
        data = _code_bytes(code, getattr(fn, "__doc__", None)) or repr(fn).encode()
    return digest(data)[:16]


def _tree_bytes(source: str) -> bytes:
    """The function's syntax tree with decorators and the docstring dropped."""
    node = ast.parse(source).body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError("not a def")
    node.decorator_list = []
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
    return ast.dump(node, annotate_fields=False, include_attributes=False).encode()


def _code_bytes(code: types.CodeType | None, doc: str | None = None) -> bytes:
    if code is None:
        return b""
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    consts = code.co_consts
    if doc is not None and consts and consts[0] == doc:     # the docstring
        consts = consts[1:]
    for const in consts:
        if isinstance(const, types.CodeType):
            parts.append(_code_bytes(const))
        elif isinstance(const, frozenset):   # set literals: order depends on the hash seed
            parts.append(repr(sorted(repr(c) for c in const)).encode())
        else:
            parts.append(repr(const).encode())
    return b"\x00".join(parts)


def canonical(value: object) -> bytes:
    """Encode a literal argument deterministically (JSON when possible)."""
    if type(value) in _SIMPLE:
        return repr(value).encode()
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"),
                          default=_json_default).encode()
    except (TypeError, ValueError):
        try:
            return pickle.dumps(value, protocol=5)
        except Exception:
            import cloudpickle  # what pickle refuses: rare, so not imported up front
            data: bytes = cloudpickle.dumps(value)
            return data


def _json_default(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(type(value).__name__)


def fingerprint(name: str, version: str, literals: bytes, upstream: Iterable[str]) -> str:
    """Combine what decides a task's result into one hash."""
    return finish_fingerprint(fingerprint_base(name, version), literals, upstream)


def fingerprint_base(name: str, version: str) -> Any:
    """The part of a fingerprint fixed per task (hash it once, ``copy()`` per call)."""
    return hashlib.blake2b(name.encode() + b"\x00" + version.encode() + b"\x00",
                           digest_size=16)


def finish_fingerprint(base: Any, literals: bytes, upstream: Iterable[str]) -> str:
    """Complete a :func:`fingerprint_base` with one call's literals and upstream hashes."""
    h = base.copy()
    h.update(literals)
    for up in upstream:
        h.update(b"\x00")
        h.update(up.encode())
    return h.hexdigest()  # type: ignore[no-any-return]


def item_key(item: object, key: str | Callable[[Any], object] | None) -> str:
    """Return the stable key of one item of a ``.map`` fan-out."""
    if key is None:
        raw: object = item if type(item) in (str, int) else None
        if raw is None:
            return digest(canonical(item))[:12]
    elif isinstance(key, str):
        try:
            raw = item[key]  # type: ignore[index]
        except (KeyError, TypeError, IndexError):
            raw = getattr(item, key)
    else:
        raw = key(item)
    text = str(raw)
    if len(text) > 80 or "[" in text or "]" in text:
        text = text[:40].replace("[", "(").replace("]", ")") + "~" + digest(text.encode())[:8]
    return text
