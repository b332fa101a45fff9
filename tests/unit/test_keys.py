"""Code versions: what changes them and what does not."""

from __future__ import annotations

import tempfile
import textwrap
import types
from pathlib import Path

import pytest

from ledgerflow.keys import code_version

_HOME: list[Path] = []      # this test's tmp_path: the modules' files go there


@pytest.fixture(autouse=True)
def _home(tmp_path: Path):
    _HOME[:] = [tmp_path]
    yield
    _HOME.clear()


def _define(source: str) -> types.FunctionType:
    """Define ``f`` from ``source`` in a real file, so inspect finds its source."""
    import importlib.util
    folder = Path(tempfile.mkdtemp(dir=_HOME[0]))
    path = folder / "mod_under_test.py"
    path.write_text("from ledgerflow import task\n" + textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"m{abs(hash(source))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = module.f
    return getattr(fn, "fn", fn)


BASE = """
def f(x):
    return x + 1
"""


def test_docstrings_comments_formatting_and_decorators_do_not_change_it() -> None:
    base = code_version(_define(BASE))
    assert code_version(_define('''
        def f(x):
            """Add one."""
            # a comment
            return (x +
                    1)
        ''')) == base
    assert code_version(_define('''
        @task(retries=1,
              retry_delay=0.5)
        def f(x):
            return x + 1
        ''')) == base


def test_the_body_and_the_signature_change_it() -> None:
    base = code_version(_define(BASE))
    assert code_version(_define("def f(x):\n    return x + 2\n")) != base
    assert code_version(_define("def f(x, y=1):\n    return x + 1\n")) != base
    assert code_version(_define('def f(x):\n    """Doc."""\n')) != base
