"""``pipeline explain`` / ``Run.explain()``: each reason a task ran or was reused, read back
from a real ledger (DuckDB, and PostgreSQL on the suite's own server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import NonRetryableError, pipeline, task
from ledgerflow.errors import TaskNotFoundError
from tests.postgres.conftest import pg_server, pg_url  # noqa: F401  (the server fixtures)

FLAGS: dict[str, bool] = {"fail": False, "verified": True}


@task
def source(n: int) -> int:
    return n


@task
def square(v: int) -> int:
    return v * v


@task(version="v1", name="label")
def label_v1(v: int) -> str:
    return f"#{v}"


@task(version="v2", name="label")
def label_v2(v: int) -> str:
    return f"#{v}"


@task
def shout(text: str) -> str:
    return text.upper()


@task
def fragile(v: int) -> int:
    if FLAGS["fail"]:
        raise NonRetryableError("told to fail")
    return v + 1


@task(verify=lambda result, v: FLAGS["verified"])
def effect(v: int) -> int:
    return v * 10


@task(cache=False)
def look(v: int) -> int:
    return v


@pipeline
def chain(n: int = 2) -> str:
    v = source(n)
    return shout(label_v1(square(v)))


@pipeline(name="chain")
def chain_v2(n: int = 2) -> str:
    v = source(n)
    return shout(label_v2(square(v)))


@pipeline
def effects(n: int = 1) -> int:
    v = source(n)
    look(v)
    effect(v)
    return square(fragile(v))


ATTEMPTS: dict[str, int] = {}


@task(retries=1, retry_delay=0)
def flaky(v: int) -> int:
    ATTEMPTS["flaky"] = ATTEMPTS.get("flaky", 0) + 1
    if ATTEMPTS["flaky"] <= 1:
        raise RuntimeError("first try fails")
    return v


@task
def double(item: dict[str, int]) -> int:
    return 2 * item["v"]


@task
def total(xs: list[int]) -> int:
    return sum(xs)


@pipeline
def fanout(vs: list[int] = [1, 2, 3]) -> int:  # noqa: B006  (a literal default, never mutated)
    items = [{"id": i, "v": v} for i, v in enumerate(vs)]
    return total(double.map(items, key="id"))


@pipeline
def retrying(n: int = 1) -> int:
    return flaky(n)


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    FLAGS.update(fail=False, verified=True)
    if request.param == "duckdb":
        yield str(tmp_path / "ledger.duckdb")
    else:
        yield request.getfixturevalue("pg_url")


def reasons(run: object, against: str | None = None) -> dict[str, str]:
    return {t.key: t.reason for t in run.explain(against=against).tasks}  # type: ignore[attr-defined]


def test_a_first_run_is_new_and_a_rerun_is_cached_from_it(store: str) -> None:
    first = chain.run(store=store)
    assert set(reasons(first).values()) == {"new"}
    again = chain.run(store=store)
    res = again.explain()
    assert res.against == first.run_id
    assert {t.reason for t in res.tasks} == {"cached"}
    t = res.by_key()["square"]
    assert (t.source_run, t.source_key) == (first.run_id, "square")
    assert first.run_id in t.detail


def test_a_parameter_change_names_the_parameter_and_the_changed_input(store: str) -> None:
    first = chain.run(store=store, n=2)
    second = chain.run(store=store, n=3)
    res = second.explain(against=first.run_id).by_key()
    assert res["source"].reason == "argument"
    assert res["source"].changes["params"] == {"n": [2, 3]}
    assert "n 2 -> 3" in res["source"].detail
    assert res["square"].reason == "input"
    old, new = res["square"].changes["inputs"]["source"]
    assert old != new and old is not None
    assert f"source {old[:12]} -> {new[:12]}" in res["square"].detail


def test_a_code_change_names_the_task_and_leaves_equal_results_reused(store: str) -> None:
    first = chain.run(store=store)
    second = chain_v2.run(store=store)
    res = second.explain(against=first.run_id).by_key()
    assert res["label"].reason == "code"
    assert res["label"].changes["code"] == ["v1", "v2"]
    assert "the code of task 'label' changed (v1 -> v2)" in res["label"].detail
    assert res["square"].reason == "cached"
    assert res["shout"].reason == "cached"      # label's result is the same text


def test_a_task_that_ran_again_on_resume_says_so(store: str) -> None:
    FLAGS["fail"] = True
    first = effects.run(store=store)
    assert first.state == "failed"
    FLAGS["fail"] = False
    again = ledgerflow.resume(first.run_id, store=store, pipeline=effects)
    assert again.state == "succeeded"
    by = again.explain().by_key()
    assert by["fragile"].attempts == 2
    assert by["fragile"].detail.endswith(
        "in this run: attempt 1 error (NonRetryableError), then ran again when the run was "
        "resumed")
    assert "resumed" not in by["source"].detail     # it succeeded before the resume


def test_failed_before_verify_not_reused_and_not_run(store: str) -> None:
    FLAGS["fail"] = True
    first = effects.run(store=store)
    assert first.state == "failed"
    by = first.explain().by_key()
    assert by["square"].reason == "not_run" and "upstream_failed" in by["square"].detail
    FLAGS.update(fail=False, verified=False)
    second = effects.run(store=store)
    res = second.explain(against=first.run_id).by_key()
    assert res["fragile"].reason == "failed_before"
    assert f"in {first.run_id} it ended failed" in res["fragile"].detail
    assert res["effect"].reason == "verify"
    assert "cache hit rejected by verify" in res["effect"].detail
    assert res["look"].reason == "not_reused"
    assert "cache=False" in res["look"].detail
    assert res["source"].reason == "cached"


def test_one_task_and_an_unknown_task(store: str) -> None:
    run = chain.run(store=store)
    res = run.explain("square")
    assert [t.key for t in res.tasks] == ["square"]
    with pytest.raises(TaskNotFoundError, match="has no task 'squar'") as err:
        run.explain("squar")
    assert err.value.hint == "did you mean 'square'?"


def test_the_command_groups_by_reason_and_prints_json(tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text("from ledgerflow import pipeline, task\n\n"
                    "@task\ndef double(x: int) -> int:\n    return 2 * x\n\n"
                    "@pipeline\ndef many(n: int = 12, k: int = 0) -> list[int]:\n"
                    "    return double.map(list(range(n + k)))\n")
    env = {**os.environ, "LEDGERFLOW_STORE": str(tmp_path / "l.duckdb")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerflow", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    first = cli("run", str(flow))
    assert first.returncode == 0
    done = cli("run", str(flow), "-p", "k=2")
    assert done.returncode == 0
    run_id = done.stdout.split()[1]
    text = cli("explain", run_id)
    assert text.returncode == 0, text.stderr
    assert "reused (cache hit): 12" in text.stdout
    assert "ran: new task: 2" in text.stdout
    assert f"  from {first.stdout.split()[1]}: 12 double (--all lists them)" in text.stdout
    assert text.stdout.index("ran: new task") < text.stdout.index("reused")
    assert "double[13]  ran: new, no task 'double[13]' in" in text.stdout
    every = cli("explain", run_id, "--all").stdout
    assert "  double[11]  cache hit: the result of " in every
    doc = json.loads(cli("explain", run_id, "--json").stdout)
    assert doc["counts"] == {"cached": 12, "new": 2}
    assert len(doc["tasks"]) == 14
    bad = cli("explain", run_id, "--task", "double[99]")
    assert bad.returncode == 2
    assert "has no task 'double[99]'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_changed_fan_out_item_and_a_changed_child_of_an_upstream_fan_out(store: str) -> None:
    first = fanout.run(store=store, vs=[1, 2, 3])
    second = fanout.run(store=store, vs=[1, 5, 3])
    res = second.explain(against=first.run_id).by_key()
    assert res["double[0]"].reason == "cached" and res["double[2]"].reason == "cached"
    assert res["double[1]"].reason == "argument"
    assert res["double[1]"].changes["params"] == {"vs": [[1, 2, 3], [1, 5, 3]]}
    assert res["total"].reason == "input"
    assert list(res["total"].changes["inputs"]) == ["double[1]"]     # only that child


def test_a_retry_in_the_run_is_told(store: str) -> None:
    ATTEMPTS.clear()
    run = retrying.run(store=store)
    t = run.explain("flaky").tasks[0]
    assert t.reason == "new" and t.attempts == 2
    assert "in this run: attempt 1 error (RuntimeError), then ran again" in t.detail


def test_a_task_whose_only_attempt_failed_did_not_run_again(store: str) -> None:
    ATTEMPTS.clear()
    ATTEMPTS["flaky"] = -10         # both attempts fail
    run = retrying.run(store=store)
    t = run.explain("flaky").tasks[0]
    assert t.attempts == 2
    assert t.detail.endswith("in this run: attempt 1 error (RuntimeError), attempt 2 error "
                             "(RuntimeError)"), t.detail


def test_the_notebook_display_groups_by_reason(store: str) -> None:
    chain.run(store=store)
    html = chain.run(store=store, n=5).explain()._repr_html_()
    assert "<td>cached</td>" not in html and "<td>argument</td><td>1</td>" in html
    assert "<td>input</td><td>3</td>" in html and "n 2 -&gt; 5" in html


@pipeline
def nested() -> list[int]:
    return double.map([{"id": "notes/a.md", "v": 1}], key="id")


def test_a_cache_hit_names_a_source_key_with_a_slash(store: str) -> None:
    first = nested.run(store=store)
    t = nested.run(store=store).explain("double[notes/a.md]").tasks[0]
    assert (t.reason, t.source_run, t.source_key) == ("cached", first.run_id,
                                                        "double[notes/a.md]")
