"""Prometheus: counters and histograms of runs in a textfile, parsed back with the client's parser."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ledgerflow import context, pipeline, task
from ledgerflow_observability import genai, prometheus

pytest.importorskip("prometheus_client", reason="needs the 'observability' extra")

from prometheus_client.parser import text_string_to_metric_families


@task
def cached(n: int) -> int:
    return n


@task(retries=1, retry_delay=0, cache=False)
def flaky(x: int) -> int:
    if context().attempt == 1:
        raise ValueError("first attempt fails")
    with genai.model_call("fake", "fake-model") as call:
        call.usage(100, 20, cost_usd=0.25)
    return x


@task(timeout=0.05, cache=False)
def slow(x: int) -> int:
    time.sleep(0.15)       # past its timeout: on inline the late result is rejected
    return x


@pipeline
def counted(n: int = 1):
    c = cached(n)
    return flaky(c), slow(c)


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(got: dict[Any, float], name: str, **labels: str) -> float:
    return got.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_textfile_counts_what_the_ledger_holds(tmp_path: Path, ledger: str) -> None:
    counted.run(store=ledger, executor="inline")           # fills the cache, not counted
    path = tmp_path / "metrics" / "ledgerflow.prom"
    prometheus.enable(path)
    try:
        run = counted.run(store=ledger, executor="inline")
    finally:
        prometheus.disable()
    assert run.state == "failed"
    got = samples(path)
    by_state: dict[str, int] = {}
    for e in run.events():
        by_state[e["to_state"]] = by_state.get(e["to_state"], 0) + 1
    for state, n in by_state.items():
        assert value(got, "ledgerflow_task_transitions_total", pipeline="counted",
                     state=state) == n, state
    assert value(got, "ledgerflow_task_retries_total", pipeline="counted", task="flaky") == 1
    assert value(got, "ledgerflow_cache_hits_total", pipeline="counted", task="cached") == 1
    assert [n["kind"] for n in run.notices()] == ["late_result_rejected"]
    assert value(got, "ledgerflow_results_rejected_total", pipeline="counted", kind="late") == 1
    assert value(got, "ledgerflow_runs_finished_total", pipeline="counted", state="failed") == 1
    who = {"pipeline": "counted", "provider": "fake", "model": "fake-model"}
    assert value(got, "ledgerflow_model_calls_total", **who) == 1
    assert value(got, "ledgerflow_model_tokens_total", **who, type="input") == 100
    assert value(got, "ledgerflow_model_tokens_total", **who, type="output") == 20
    assert value(got, "ledgerflow_model_cost_usd_total", **who) == 0.25
    # one duration per attempt, by outcome; the +Inf bucket is the count
    outcomes = [(a["task_key"], a["outcome"]) for a in run.attempts()]
    assert sorted(outcomes) == [("flaky", "error"), ("flaky", "ok"), ("slow", "timeout")]
    for key, outcome in outcomes:
        labels = {"pipeline": "counted", "task": key, "outcome": outcome}
        assert value(got, "ledgerflow_attempt_duration_seconds_count", **labels) == 1
        assert value(got, "ledgerflow_attempt_duration_seconds_bucket", **labels,
                     le="+Inf") == 1
    slow_sum = value(got, "ledgerflow_attempt_duration_seconds_sum", pipeline="counted",
                     task="slow", outcome="timeout")
    assert slow_sum >= 0.15
    assert value(got, "ledgerflow_attempt_duration_seconds_bucket", pipeline="counted",
                 task="slow", outcome="timeout", le="0.1") == 0
    assert value(got, "ledgerflow_queue_wait_seconds_count", pipeline="counted",
                 task="flaky") == 2


def test_drivers_add_up_in_one_textfile(tmp_path: Path, ledger: str, write_flow: Any) -> None:
    """Two driver processes at once, then one more: the file holds the sums."""
    flow = write_flow("""
        from ledgerflow import task, pipeline

        @task(cache=False)
        def one(i: int) -> int:
            return i

        @pipeline
        def many(n: int = 20):
            return one.map(list(range(n)))
        """)
    path = tmp_path / "node-exporter"
    path.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(LEDGERFLOW_PROMETHEUS=str(path), LEDGERFLOW_PROMETHEUS_INTERVAL="0.1")
    cmd = [sys.executable, "-m", "ledgerflow", "run", flow, "--store"]
    procs = [subprocess.Popen([*cmd, str(tmp_path / f"l{i}.duckdb")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        assert p.wait(120) == 0, p.stderr.read() if p.stderr else ""
        if p.stderr:
            p.stderr.close()
    done = subprocess.run([*cmd, str(tmp_path / "l0.duckdb")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = samples(path / "ledgerflow.prom")
    assert value(got, "ledgerflow_runs_finished_total", pipeline="many",
                 state="succeeded") == 3
    assert value(got, "ledgerflow_task_transitions_total", pipeline="many",
                 state="succeeded") == 3 * 20
    assert value(got, "ledgerflow_attempt_duration_seconds_count", pipeline="many", task="one",
                 outcome="ok") == 3 * 20


def test_on_with_1_writes_beside_the_ledger_and_the_console_serves_it(
        tmp_path: Path, ledger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    prometheus.enable("ledger")
    try:
        counted.run(store=ledger, executor="inline")
    finally:
        prometheus.disable()
    beside = Path(ledger + ".d") / "metrics.prom"
    assert beside.exists()
    monkeypatch.delenv("LEDGERFLOW_PROMETHEUS", raising=False)
    assert prometheus.textfile_for(ledger) == beside
    assert prometheus.exposition(ledger) == beside.read_bytes()
    assert prometheus.exposition(str(tmp_path / "other.duckdb")) == b""


@task(approve=True)
def gated(x: int) -> int:
    return x


@pipeline
def two_gates(n: int = 2):
    return gated.map(list(range(n)))


def gauges(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "gauge":
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_gauges_of_runs_in_progress_and_waiting_approvals_equal_the_ledger(
        tmp_path: Path) -> None:
    import ledgerflow
    store = str(tmp_path / "l.duckdb")
    prometheus.enable("ledger")
    try:
        run = two_gates.run(store=store, executor="inline")       # stops: waiting
        submitted = ledgerflow.control.submit(two_gates, store=store, n=3)
    finally:
        prometheus.disable()
    assert run.state == "waiting"
    beside = Path(store + ".d") / "metrics.prom"
    pending = ledgerflow.approvals(store=store)
    assert len(pending) == 2
    states = {v.run_id: v.state for v in ledgerflow.control.runs(store=store)}
    assert states == {run.run_id: "waiting", submitted: "submitted"}

    def check(got: dict[Any, float], waiting: float, runs: dict[str, float]) -> None:
        assert value(got, "ledgerflow_approvals_waiting", ledger=store,
                     pipeline="two_gates") == waiting
        for state in ("submitted", "running", "waiting", "cancelling"):
            assert value(got, "ledgerflow_runs_in_progress", ledger=store,
                         pipeline="two_gates", state=state) == runs.get(state, 0), state

    # the textfile, as the driver left it when it stopped (the submit drove nothing)
    check(gauges(beside.read_text()), 1 + 1, {"waiting": 1})
    # the console's /metrics reads them again from the ledger
    served = gauges(prometheus.exposition(store).decode())
    check(served, 2, {"waiting": 1, "submitted": 1})
    run.approve("gated[0]", digest=pending[0]["digest"], by="ana")
    check(gauges(prometheus.exposition(store).decode()), 1, {"waiting": 1, "submitted": 1})
    # the counters are still the file's
    assert value(samples(beside), "ledgerflow_task_transitions_total", pipeline="two_gates",
                 state="waiting_approval") == 2
