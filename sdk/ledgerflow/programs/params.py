"""Placeholders and parameters: ``{name}`` filling, a value as text, content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping

__all__ = ["carrier_env", "fill", "hash_path", "names", "text"]

_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def names(template: str) -> set[str]:
    """The ``{name}`` placeholders of one template (``{{``/``}}`` are literal braces)."""
    return {m.group(1) for m in _FIELD.finditer(template) if m.group(1)}


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` replaced by ``values[name]``."""
    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return values[m.group(1)]
    return _FIELD.sub(sub, template)


def text(value: object) -> str:
    """A parameter as the program sees it (argv element or environment value)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, default=str)


def hash_path(path: str) -> str | None:
    """Content hash of a file (or of a directory's files and names); None if missing."""
    h = hashlib.blake2b(digest_size=16)
    if os.path.isdir(path):
        for base, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(base, name)
                h.update(os.path.relpath(full, path).encode() + b"\x00")
                h.update((hash_path(full) or "missing").encode())
        return h.hexdigest()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def carrier_env(carrier: Mapping[str, str]) -> dict[str, str]:
    """A propagation carrier as environment variables: ``traceparent`` -> ``TRACEPARENT``.

    The OpenTelemetry convention for passing context to a child process
    (``TRACEPARENT``, ``TRACESTATE``, ``BAGGAGE``).

    Example:
        >>> carrier_env({"traceparent": "00-ab-cd-01"})
        {'TRACEPARENT': '00-ab-cd-01'}
    """
    return {re.sub(r"[^A-Z0-9_]", "_", k.upper()): v for k, v in carrier.items()}
