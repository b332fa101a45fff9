"""The recorded graph: a resume of a big run drives what is left without tracing the body.

A run of a plain pipeline records its graph (``ledgerflow.recipe``); a resume whose
frontier read kept most tasks rebuilds only the tasks left and their direct upstreams
from it. The run must end exactly as a resume that traces the body again: the same
states, attempts, fingerprints and result. Whatever the recorded form cannot hold
exactly is not recorded, and the resume traces.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import pipeline, recipe, task
from ledgerflow.results import decode
from tests.unit.test_frontier_resume import _count, _ran  # FRONTIER_LOG: what ran

TRACED: list[str] = []


@task
def inc(x: int) -> int:
    _count(f"inc{x}")
    return x + 1


@task
def add(x: int, *, step: int, opts: dict[str, Any]) -> int:
    _count(f"add{step}")
    return x + step + len(opts["xs"]) + (opts["xs"][0] == 2 ** 70)


@task
def big(n: int) -> str:
    _count("big")
    return "x" * n        # over the DuckDB store's inline limit: a result file


@task
def flaky(x: Any, tail: str = "") -> int:
    _count("flaky")
    if not os.path.exists(os.environ["RECIPE_FLAG"]):
        raise ValueError("not yet")
    return (x if isinstance(x, int) else len(x)) * 10 + len(tail)


@pipeline
def shaped(n: int = 60, tag: str = "t\"'\n", ratio: float = 0.1):
    TRACED.append("shaped")
    x = inc(0)
    for i in range(n - 1):
        x = add(x, step=i, opts={"tag": tag, "xs": [2 ** 70, ratio, None, True, "é", -0.0]})
    mark = inc(1000)
    return {"value": flaky(x, tail=tag, after=[mark]), "first": [x]}


@pipeline
def blobbed(n: int = 60):
    TRACED.append("blobbed")
    x = inc(0)
    for _ in range(n - 1):
        x = inc(x)
    return flaky(big(5000), after=[x])


@pipeline
def fanned(n: int = 60):
    return flaky.map(list(range(n)))


@pipeline
def tupled(n: int = 60):
    x = inc(0)
    for _ in range(n - 1):
        x = inc(x)
    return flaky((x, 1))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("FRONTIER_LOG", str(tmp_path / "ran.log"))
    monkeypatch.setenv("RECIPE_FLAG", str(tmp_path / "flag"))
    monkeypatch.setattr(recipe, "MIN_NODES", 50)
    TRACED.clear()
    yield tmp_path / "flag"


def _failed(pipe: Any, store: str, flag: Path) -> str:
    flag.unlink(missing_ok=True)
    run = pipe.run(store=store, executor="inline", wait=True)
    assert run.status().state == "failed"
    flag.write_text("ok")
    return run.run_id


def _rows(store: str, run_id: str) -> dict[str, tuple[Any, ...]]:
    tasks = ledgerflow.get_run(run_id, store=store).status().tasks
    return {k: (t.state, t.attempts, t.fingerprint, t.result_hash) for k, t in tasks.items()}


def test_a_resume_of_a_recorded_run_drives_only_what_is_left_without_tracing(
        tmp_path: Path, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lean, full = str(tmp_path / "lean.duckdb"), str(tmp_path / "full.duckdb")
    lean_id = _failed(shaped, lean, env)
    full_id = _failed(shaped, full, env)
    assert TRACED == ["shaped", "shaped"]
    before = _ran(tmp_path)
    run = ledgerflow.resume(lean_id, store=lean, executor="inline")
    assert TRACED == ["shaped", "shaped"]           # the body did not run again
    assert _ran(tmp_path)[len(before):] == ["flaky"]
    assert run.graph is not None and run.graph.partial
    # the task left, its data upstream and its after= upstream; none of the other 59
    assert sorted(run.graph.nodes) == ["add-59", "flaky", "inc-2"]
    with monkeypatch.context() as m:                # the same resume, traced
        m.setattr(recipe, "partial", lambda pipe, view, store: None)
        traced = ledgerflow.resume(full_id, store=full, executor="inline")
    assert TRACED == ["shaped", "shaped", "shaped"]
    assert run.result() == traced.result()
    assert run.result()["value"] == traced.result()["first"][0] * 10 + len("t\"'\n")
    assert _rows(lean, lean_id) == _rows(full, full_id)


def test_a_success_whose_result_file_is_gone_runs_again_from_its_recorded_call(
        tmp_path: Path, env: Path) -> None:
    store = str(tmp_path / "ledger.duckdb")
    run_id = _failed(blobbed, store, env)
    st = ledgerflow.get_run(run_id, store=store).store
    uri = ledgerflow.get_run(run_id, store=store).status().tasks["big"].result_uri
    assert uri is not None
    os.remove(st.result_path(uri))                  # type: ignore[attr-defined]
    before = _ran(tmp_path)
    run = ledgerflow.resume(run_id, store=store, executor="inline")
    assert run.result() == 50000
    assert TRACED == ["blobbed"]        # a result in a file: its row is read, its call kept
    assert run.graph is not None and "big" in run.graph.nodes
    assert sorted(_ran(tmp_path)[len(before):]) == ["big", "flaky"]


def test_what_the_recorded_form_cannot_hold_exactly_is_not_recorded(env: Path) -> None:
    plain = recipe.record(shaped, shaped.build())
    assert plain is not None and plain.kind == "json"
    assert recipe.record(fanned, fanned.build()) is None       # a fan-out
    assert recipe.record(tupled, tupled.build()) is None       # a tuple comes back a list
    for bad in (math.nan, math.inf, Path("/tmp"), (1, 2), {1: "a"}, {"$ref": "x"}, b"x"):
        graph = shaped.build()
        graph.nodes["add"].kwargs = {"step": 0, "opts": {"xs": [bad]}}
        assert recipe.record(shaped, graph) is None, bad
    small = shaped.build(n=10)
    assert recipe.record(shaped, small) is None                # re-tracing it costs less


def test_a_recorded_graph_decodes_to_the_traced_nodes(env: Path) -> None:
    graph = shaped.build()
    enc = recipe.record(shaped, graph)
    assert enc is not None
    doc = decode(enc.kind, enc.data)
    assert doc["keys"] == list(graph.nodes) and doc["names"] == ["inc", "add", "flaky"]
    assert doc["after"] == {"flaky": ["inc-2"]}


def test_a_pipeline_defined_outside_a_source_file_records_no_graph(env: Path) -> None:
    # as in a notebook cell: the body's module has no file to version
    cell = {"__name__": "lf_cell_without_a_file", "inc": inc, "pipeline": pipeline}
    exec("@pipeline\ndef cell(n=60):\n    x = inc(0)\n    for _ in range(n - 1):\n"
         "        x = inc(x)\n    return x\n", cell)
    pipe = cell["cell"]
    assert len(pipe.build()) == 60
    assert recipe.record(pipe, pipe.build()) is None
    assert recipe.record(blobbed, blobbed.build()) is not None


def test_only_a_store_a_resume_reads_a_recipe_from_records_one(tmp_path: Path, env: Path) -> None:
    from ledgerflow_stores.memory import MemoryStore

    mem = MemoryStore()
    for st in (mem, str(tmp_path / "ledger.duckdb")):
        run = shaped.run(store=st, executor="inline")
        options = json.loads(run.store.get_run(run.run_id, tasks=False).options or "{}")
        assert ("recipe" in options) is (st is not mem), options    # memory: no frontier read


def _frontier_of_failed(tmp_path: Path, flag: Path) -> tuple[Any, Any]:
    """A failed run of ``shaped`` on DuckDB: its store, and its frontier read."""
    from ledgerflow_stores.duckdb.store import DuckDBStore

    st = DuckDBStore(str(tmp_path / "ledger.duckdb"))
    view = st.frontier(_failed(shaped, st.location, flag))
    assert view is not None and view.settled
    return st, view


def test_a_row_the_recorded_graph_does_not_name_makes_the_resume_trace(
        tmp_path: Path, env: Path) -> None:
    from ledgerflow.views import TaskRow

    st, view = _frontier_of_failed(tmp_path, env)
    assert recipe.partial(shaped, view, st) is not None
    view.tasks["stranger"] = TaskRow("stranger", "inc", state="failed")
    assert recipe.partial(shaped, view, st) is None


@pytest.mark.parametrize("damage", [b"not json", b'{"v": 99}'])
def test_an_unreadable_or_unknown_recipe_makes_the_resume_trace(
        tmp_path: Path, env: Path, damage: bytes) -> None:
    store = str(tmp_path / "ledger.duckdb")
    run_id = _failed(shaped, store, env)
    st = ledgerflow.get_run(run_id, store=store).store
    options = json.loads(st.get_run(run_id, tasks=False).options or "{}")
    Path(st.result_path(options["recipe"])).write_bytes(damage)     # type: ignore[attr-defined]
    run = ledgerflow.resume(run_id, store=store, executor="inline")
    assert TRACED == ["shaped", "shaped"]           # traced again, and right
    assert run.graph is not None and not run.graph.partial
    assert run.result()["value"] == run.result()["first"][0] * 10 + len("t\"'\n")


def test_a_drive_between_the_read_and_the_takeover_makes_the_resume_trace(
        tmp_path: Path, env: Path) -> None:
    from ledgerflow.launch import continue_run
    from ledgerflow.opening import settings_for

    st, view = _frontier_of_failed(tmp_path, env)
    graph = recipe.partial(shaped, view, st)
    assert graph is not None and graph.partial
    view.token -= 1         # as if another driver took the run over after this read
    run = continue_run(shaped, view, st, settings=settings_for(st, "inline"),
                       executor="inline", graph=graph, cache={})
    assert run.state == "succeeded"
    assert TRACED == ["shaped", "shaped"]           # its prior was read again: traced
    assert run.graph is not None and not run.graph.partial
    assert _ran(tmp_path).count("flaky") == 2       # the failed attempt, then this one
