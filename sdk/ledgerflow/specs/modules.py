"""Importing a Python file by path (a pipeline file, or a module of tasks a spec names).

The file's folder goes on ``sys.path`` (so its sibling modules import), and
the module records its file as ``__ledgerflow_file__``: importing the same
file again returns the same module, and a task defined there pickles by value.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError, PipelineError

#: The modules imported by path, by resolved file (a spec of 20,000 steps naming one
#: file finds it here, not by a scan of ``sys.modules`` per step).
_BY_FILE: dict[str, Any] = {}


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
    known = _BY_FILE.get(str(p))
    if known is not None and sys.modules.get(known.__name__) is known:
        return known
    for mod in list(sys.modules.values()):      # e.g. put back in sys.modules by hand
        if getattr(mod, "__ledgerflow_file__", None) == str(p):
            _BY_FILE[str(p)] = mod
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
        where = f"{exc.filename or path}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        error = InputError(f"syntax error in {where}: {exc.msg}",
                           hint="fix the pipeline module and run again")
        error.detail = _source_and_caret(exc)
        raise error from exc
    except Exception as exc:
        del sys.modules[name]
        where = _user_line(exc, str(p))
        # ledgerflow's own error (a task or model declared wrong) knows the fix itself
        own = exc.hint if isinstance(exc, PipelineError) else ""
        raise InputError(f"importing {path} failed{where}: {type(exc).__name__}: {exc}",
                         hint=own or "fix the error raised while the module is imported "
                         "(run with --debug for the traceback)") from exc
    _BY_FILE[str(p)] = module
    return module


def _source_and_caret(exc: SyntaxError) -> tuple[str, ...]:
    """The offending source line and a caret under the column, as Python shows them."""
    if not exc.text:
        return ()
    raw = exc.text.rstrip("\n")
    code = raw.lstrip()
    if not code:
        return ()
    col = max((exc.offset or 1) - 1 - (len(raw) - len(code)), 0)
    width = 1
    if exc.end_offset and exc.end_lineno in (None, exc.lineno) and exc.end_offset > (exc.offset or 0):
        width = exc.end_offset - (exc.offset or 0)
    return (code, " " * min(col, len(code)) + "^" * width)


def _user_line(exc: BaseException, path: str) -> str:
    """`` at line N`` of ``path`` in ``exc``'s traceback, if it is there."""
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {line}" if line else ""
