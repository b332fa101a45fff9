"""Finding pipelines: import a target (``FILE.py[:NAME]``, ``module:NAME``, a spec).

A run records its *target* (``Pipeline.target()``) so that ``resume``, in
any process, loads the very pipeline that started it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from .errors import InputError
from .pipeline import Pipeline
from .specs.modules import load_module

__all__ = ["abs_target", "load_module", "load_target", "pipelines_in", "split_target"]


def pipelines_in(module: Any) -> dict[str, Pipeline[..., Any]]:
    """The pipelines a module defines, by name."""
    return {v.name: v for v in vars(module).values() if isinstance(v, Pipeline)}


def split_target(target: str) -> tuple[str, str]:
    """``FILE.py:NAME`` -> ``("FILE.py", "NAME")`` (Windows drive letters kept)."""
    if target.count(":") and not (len(target) > 1 and target[1] == ":"
                                  and target.count(":") == 1):
        path, _, name = target.rpartition(":")
        if path:
            return path, name
    return target, ""


def load_target(target: str) -> Pipeline[..., Any]:
    """Load ``FILE.py[:NAME]``, ``package.module:NAME`` or a ``.json``/``.toml`` spec."""
    path, name = split_target(target)
    if path.endswith((".json", ".toml")):
        from .specs.document import load_spec
        return load_spec(path)
    if path.endswith(".py") or os.sep in path or os.path.isdir(path):
        module = load_module(path)
    elif path == "__main__":
        module = sys.modules["__main__"]
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


def abs_target(target: str, pipeline: str | None = None) -> str:
    """``target`` as a run records it for resume: a file path made absolute and, for
    Python, the pipeline's name added (``pipeline``) when the target had none."""
    path, name = split_target(target)
    name = name or ("" if path.endswith((".json", ".toml")) else pipeline or "")
    if path.endswith((".py", ".json", ".toml")):
        return str(Path(path).resolve()) + (f":{name}" if name else "")
    return f"{path}:{name}" if name else target
