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


def load_module(path: str | Path) -> Any:
    """Import a pipeline file by path (its folder goes on ``sys.path``)."""
    p = Path(path).resolve()
    if not p.exists():
        raise InputError(f"pipeline file not found: {path}",
                         hint="pass the path of a .py file, e.g. pipeline run flows.py")
    if p.is_dir():
        raise InputError(f"{path} is a directory, not a pipeline file",
                         hint="pass FILE.py[:PIPELINE], e.g. pipeline run flows.py")
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
        where = _user_line(exc, str(p))
        raise InputError(f"importing {path} failed{where}: {type(exc).__name__}: {exc}",
                         hint="fix the error raised while the module is imported "
                         "(run with --debug for the traceback)") from exc
    return module


def _user_line(exc: BaseException, path: str) -> str:
    """`` at line N`` of ``path`` in ``exc``'s traceback, if it is there."""
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {line}" if line else ""


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
        from .spec import load_spec
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
