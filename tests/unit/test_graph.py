from __future__ import annotations

import json

import pytest

from ledgerflow import CycleError, DefinitionError, pipeline, task
from ledgerflow.errors import DuplicateTaskError, MissingInputError, ParameterBindError
from ledgerflow.specs.document import load_spec


@task
def one() -> int:
    return 1


@task(retries=2, name="plus")
def add(a: int, b: int = 1) -> int:
    return a + b


def plain(x: int) -> int:
    return x


def test_a_task_outside_a_pipeline_is_a_plain_call() -> None:
    assert add(2, 3) == 5
    assert add.map([1, 2], b=10) == [11, 12]
    assert add.name == "plus" and add.options.retries == 2


def test_calls_build_nodes_and_edges() -> None:
    @pipeline
    def p(x: int = 1):
        a = one()
        b = add(a, x)
        c = add(a, b)
        return add.map([1, 2, 3], after=[c])

    g = p.build()
    assert list(g.nodes) == ["one", "plus", "plus-2", "plus-3"]
    assert g.nodes["plus-2"].deps == ("one", "plus")
    assert g.nodes["plus-3"].is_map and g.nodes["plus-3"].after == ("plus-2",)
    assert "flowchart" in g.to_mermaid() and "digraph" in g.to_dot()


def test_validation_reports_every_problem_at_once() -> None:
    @pipeline
    def p():
        a = one()
        add(a, after=[one])            # a task, not a call result
        add(a, after=["nonsense"])     # not a reference
        add.map(plain)                 # a function, not a list

    with pytest.raises(DefinitionError) as info:
        p.build()
    assert len(info.value.problems) == 3
    assert any("a task, not a call result" in x for x in info.value.problems)


def test_duplicate_task_names_are_rejected() -> None:
    @task(name="dup")
    def f() -> int:
        return 1

    @task(name="dup")
    def g() -> int:
        return 2

    @pipeline
    def p():
        f()
        g()

    with pytest.raises(DuplicateTaskError, match="used by two different functions") as err:
        p.build()
    assert isinstance(err.value, DefinitionError) and "@task(name=" in err.value.hint


def test_bad_parameters_are_refused() -> None:
    @pipeline
    def p(n: int):
        return one()

    with pytest.raises(MissingInputError, match="needs parameter 'n'") as err:
        p.build()
    assert isinstance(err.value, ParameterBindError) and "-p n=" in err.value.hint
    with pytest.raises(ParameterBindError):
        p.build(n=1, m=2)


def _spec(tmp_path, tasks: dict) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "s", "tasks": tasks}))
    return str(path)


def test_spec_cycle_is_named(tmp_path) -> None:
    path = _spec(tmp_path, {
        "a": {"task": "tests.unit.test_graph:one", "after": ["c"]},
        "b": {"task": "tests.unit.test_graph:one", "after": ["a"]},
        "c": {"task": "tests.unit.test_graph:one", "after": ["b"]},
    })
    with pytest.raises(CycleError) as info:
        load_spec(path).build()
    cyc = info.value.cycle
    assert cyc[0] == cyc[-1] and set(cyc) == {"a", "b", "c"}
    assert " -> ".join(cyc) in str(info.value)


def test_spec_unknown_names_and_plain_functions(tmp_path) -> None:
    path = _spec(tmp_path, {
        "a": {"task": "tests.unit.test_graph:plain"},
        "b": {"task": "tests.unit.test_graph:one", "after": ["zzz"]},
        "c": {"task": "tests.unit.test_graph:nothing"},
    })
    with pytest.raises(DefinitionError) as info:
        load_spec(path).build()
    text = " | ".join(info.value.problems)
    assert "not a @task" in text and "unknown task 'zzz'" in text and "no attribute" in text


def test_spec_runs(tmp_path) -> None:
    path = _spec(tmp_path, {
        "b": {"task": "tests.unit.test_graph:add", "inputs": {"a": "a"}, "args": {"b": 5}},
        "a": {"task": "tests.unit.test_graph:one"},
    })
    import ledgerflow
    run = ledgerflow.run(path, store=":memory:", executor="inline")
    assert run.state == "succeeded"
    assert run.result("b") == 6
