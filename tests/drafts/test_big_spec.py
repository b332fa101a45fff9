"""A big spec is checked in one pass: each module its steps name is looked up once.

No timing is asserted (the machine may be loaded): the test counts the module
lookups of a 3,000-step spec whose steps name two modules, one by file and one
by import name, through the real check and graph build.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledgerflow.specs import catalogue
from ledgerflow.specs.document import load_spec

TASKS = '''
from ledgerflow import task


@task
def {first}(x: int = 1) -> int:
    return x


@task
def {then}(a: int, b: int = 0) -> int:
    return a + b
'''
N = 3000


def test_each_module_of_a_big_spec_is_looked_up_once(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "big_by_path.py").write_text(TASKS.format(first="start", then="step"))
    (tmp_path / "big_by_name_4c1e.py").write_text(TASKS.format(first="begin", then="more"))
    tasks: dict[str, Any] = {"s0": {"task": "big_by_path.py:start"}}
    for i in range(1, N):
        ref = "big_by_path.py:step" if i % 2 else "big_by_name_4c1e:more"
        tasks[f"s{i}"] = {"task": ref, "inputs": {"a": f"s{i - 1}"}, "args": {"b": i}}
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps({"name": "big", "tasks": tasks}))
    looked_up: Counter[str] = Counter()
    real = catalogue.find_module

    def counting(name: str, folder: str | None = None) -> Any:
        looked_up[name] += 1
        return real(name, folder)

    monkeypatch.setattr(catalogue, "find_module", counting)
    pipe = load_spec(spec)
    report = pipe.check()
    assert report.valid, report.problems[:3]
    assert len(report.order) == N and report.order[0] == "s0"
    assert looked_up == {"big_by_path.py": 1, "big_by_name_4c1e": 1}
    graph = pipe.build()                 # a second check: again once per module
    assert len(graph) == N and graph.nodes["s2999"].deps == ("s2998",)
    assert looked_up == {"big_by_path.py": 2, "big_by_name_4c1e": 2}
