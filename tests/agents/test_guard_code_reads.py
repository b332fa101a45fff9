"""Issue 31 #8: a path the model chose reaches no code file outside the tool's roots, not
even through a module that reads files for its caller; the runtime's code reads still work.

Before, only the tool's own ``open`` was refused: ``linecache.getline(path)``,
``tokenize.open(path)`` or ``configparser.read(path)`` asked "as the runtime" and read
a project's ``settings.py`` on ``sys.path`` (a folder of code, so an import root).
"""

from __future__ import annotations

import configparser
import importlib
import inspect
import linecache
import sys
import tokenize
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import pytest

from ledgerflow_agents.errors import PathNotAllowed
from ledgerflow_agents.guard import Guard, guarded

SECRET = "sk-settings-5d1c0e-planted"


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project folder on ``sys.path`` with a ``settings.py`` holding a key."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "settings.py").write_text(f"API_KEY = {SECRET!r}\n")
    (folder / "v31_helper_mod.py").write_text("VALUE = 7\n")
    sys.path.insert(0, str(folder))
    linecache.clearcache()
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("v31_helper_mod", None)
        linecache.clearcache()


def _whole(fh: TextIO) -> str:
    with fh:
        return fh.read()


def _read_with(how: str, path: str) -> str:
    """A tool's code: read ``path`` (the model's choice) through a library."""
    readers: dict[str, Callable[[], object]] = {
        "linecache": lambda: linecache.getline(path, 1),
        "tokenize": lambda: _whole(tokenize.open(path)),
        "configparser": lambda: configparser.ConfigParser().read(path),
        "open": lambda: _whole(open(path)),
    }
    return repr(readers[how]())


@pytest.mark.parametrize("how", ["linecache", "tokenize", "configparser", "open"])
def test_a_model_chosen_path_reads_no_code_file_through_a_library(
        project: Path, tmp_path: Path, how: str) -> None:
    roots = tmp_path / "roots"
    roots.mkdir()
    g = Guard("peek", reads=(str(roots),), writes=(), code=Guard.code_of(_read_with))
    got = ""
    with guarded(g):
        try:
            got = _read_with(how, str(project / "settings.py"))
        except PathNotAllowed:
            got = "refused"
        except configparser.Error as exc:        # what it read, in the error text
            got = str(exc)
    assert got == "refused" and SECRET not in got
    assert [k for k, _ in g.violations] == ["path_not_allowed"]


def _runtime_reads(module_file: str) -> list[str]:
    """A tool's code that makes the runtime read code: an import, a traceback, inspect."""
    mod = importlib.import_module("v31_helper_mod")
    try:
        raise ValueError("boom")
    except ValueError:
        tb = traceback.format_exc()
    return [str(mod.VALUE), tb, inspect.getsource(mod), linecache.getline(module_file, 1)]


def test_the_runtime_still_reads_code_for_imports_tracebacks_and_inspect(
        project: Path, tmp_path: Path) -> None:
    own = Path(__file__).resolve()
    g = Guard("ok", reads=(str(own),), writes=(), code=Guard.code_of(_runtime_reads))
    with guarded(g):
        value, tb, source, line = _runtime_reads(str(own))
    assert value == "7" and "raise ValueError" in tb and source == "VALUE = 7\n"
    assert line.startswith('"""Issue 31 #8')            # inside its roots: its own file
    assert g.violations == []
