"""OpenTelemetry: the span tree of a run, spans opened inside tasks, gen_ai spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow_observability import genai, otel

pytest.importorskip("opentelemetry.sdk", reason="needs the 'observability' extra")

from opentelemetry.trace import StatusCode


@task
def stable(n: int) -> int:
    return n


@task(retries=1, retry_delay=0, cache=False)
def flaky(x: int) -> int:
    if context().attempt == 1:
        raise ValueError("first attempt fails")
    return x + 1


@task(cache=False)
def bad(x: int) -> int:
    raise RuntimeError("always broken")


@task(cache=False)
def after_bad(x: int) -> int:
    return x


@pipeline
def mixed(n: int = 1):
    s = stable(n)
    return flaky(s), after_bad(bad(s))


@task(cache=False)
def opens_span() -> dict[str, Any]:
    """Open a span with a tracer of the task's own (in whatever process runs it)."""
    from opentelemetry.sdk.trace import TracerProvider
    provider = TracerProvider()
    with provider.get_tracer("user-code").start_as_current_span("user work") as span:
        ctx = span.get_span_context()
        parent = span.parent           # type: ignore[attr-defined]
        return {"trace_id": f"{ctx.trace_id:032x}",
                "parent": None if parent is None else f"{parent.span_id:016x}",
                "pid": os.getpid()}


@pipeline
def user_span():
    return opens_span()


@task(cache=False)
def agent_step(question: str) -> str:
    with genai.model_call("fake", "fake-model", max_tokens=64, temperature=0.0) as call:
        call.usage(21, 5, cost_usd=0.001, finish_reason="tool_calls", response_id="resp-1")
    with genai.tool_call("search_index", call_id="call_0_0"):
        pass
    with genai.model_call("fake", "fake-model") as call:
        call.usage(30, 7, finish_reason="stop")
    return f"answer to {question}"


@pipeline
def agent():
    return agent_step("what?")


def _by_name(spans: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    for v in out.values():
        v.sort(key=lambda s: s.attributes.get("ledgerflow.attempt", 0))
    return out


def test_span_tree_of_a_run_with_a_retry_a_failure_and_a_cached_task(spans: Any,
                                                                       ledger: str) -> None:
    otel.disable()
    first = mixed.run(store=ledger, executor="threads")     # untraced: fills the cache
    assert first.state == "failed"
    otel.enable(spans_provider(spans))
    run = mixed.run(store=ledger, executor="threads")
    assert run.state == "failed"
    got = _by_name(spans.get_finished_spans())
    (root,) = got["run mixed"]
    assert root.parent is None
    assert root.attributes["ledgerflow.run_id"] == run.run_id
    assert root.attributes["ledgerflow.state"] == "failed"
    assert root.status.status_code == StatusCode.ERROR
    trace_id = root.context.trace_id
    tasks = [s for s in spans.get_finished_spans() if s.name.startswith("task ")]
    assert {s.name for s in tasks} == {"task stable", "task flaky", "task bad"}
    for s in tasks:                 # every attempt span is a child of the run's span
        assert s.context.trace_id == trace_id and s.parent.span_id == root.context.span_id
    assert "task after_bad" not in got      # upstream_failed: it never ran

    (cached,) = got["task stable"]
    assert cached.attributes["ledgerflow.cache_hit"] is True
    assert cached.attributes["ledgerflow.cached_from"] == first.run_id
    assert cached.attributes["ledgerflow.outcome"] == "cached"
    assert cached.start_time == cached.end_time

    one, two = got["task flaky"]
    assert [one.attributes["ledgerflow.attempt"], two.attributes["ledgerflow.attempt"]] == [1, 2]
    assert one.attributes["ledgerflow.outcome"] == "error"
    assert one.status.status_code == StatusCode.ERROR
    exc = [e for e in one.events if e.name == "exception"]
    assert exc and exc[0].attributes["exception.type"] == "ValueError"
    assert "first attempt fails" in exc[0].attributes["exception.message"]
    assert "Traceback" in exc[0].attributes["exception.stacktrace"]
    assert [e.name for e in one.events][:2] == ["running", "retry_wait"]
    view = run.status()
    assert two.attributes["ledgerflow.outcome"] == "ok"
    assert two.attributes["ledgerflow.fingerprint"] == view.tasks["flaky"].fingerprint
    assert two.attributes["ledgerflow.content_hash"] == view.tasks["flaky"].result_hash
    assert two.attributes["ledgerflow.cache_hit"] is False
    assert two.status.status_code != StatusCode.ERROR
    assert "succeeded" in [e.name for e in two.events]

    (broken,) = got["task bad"]
    assert broken.attributes["ledgerflow.outcome"] == "error"
    assert broken.status.status_code == StatusCode.ERROR
    assert "RuntimeError" in (broken.status.description or "")

    # spans start at the running commit the ledger holds, and end at the attempt's end
    running = {(e["task_key"], e["attempt"]): e["ts"] for e in run.events()
               if e["to_state"] == "running"}
    ended = {(a["task_key"], a["attempt"]): a["ended_at"] for a in run.attempts()}
    for s in tasks:
        k = (s.attributes["ledgerflow.task_key"], s.attributes["ledgerflow.attempt"])
        if k in running:
            assert abs(s.start_time / 1e9 - running[k]) < 1e-5
            assert abs(s.end_time / 1e9 - ended[k]) < 1e-5


def spans_provider(exporter: Any) -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_a_span_opened_in_a_task_on_processes_nests_under_its_attempt(spans: Any,
                                                                       ledger: str) -> None:
    run = user_span.run(store=ledger, executor="processes", workers=1)
    got = run.result()
    assert got["pid"] != os.getpid()            # it ran in a worker process
    (attempt,) = _by_name(spans.get_finished_spans())["task opens_span"]
    assert got["trace_id"] == f"{attempt.context.trace_id:032x}"
    assert got["parent"] == f"{attempt.context.span_id:016x}"


@task(cache=False)
def opens_global_span() -> dict[str, Any]:
    """Open spans with the global tracer, as instrumented libraries do."""
    from opentelemetry import trace
    tracer = trace.get_tracer("user-code", "1.0")
    with tracer.start_as_current_span("user work", attributes={"rows": 3}) as span:
        span.add_event("halfway", {"done": 1})
        with tracer.start_as_current_span("inner"):
            pass
        return {"pid": os.getpid()}


@pipeline
def global_span():
    return opens_global_span()


def test_spans_of_the_global_tracer_in_a_processes_worker_reach_the_driver(
        spans: Any, ledger: str) -> None:
    """Tracing turned on from Python (a provider of the driver's): the worker's spans are
    exported by it, under the attempt."""
    run = global_span.run(store=ledger, executor="processes", workers=1)
    assert run.state == "succeeded"
    assert run.result()["pid"] != os.getpid()          # it ran in a worker process
    got = _by_name(spans.get_finished_spans())
    (attempt,) = got["task opens_global_span"]
    (user,) = got["user work"]
    (inner,) = got["inner"]
    assert user.context.trace_id == inner.context.trace_id == attempt.context.trace_id
    assert user.parent.span_id == attempt.context.span_id
    assert inner.parent.span_id == user.context.span_id
    assert user.attributes["rows"] == 3
    assert [(e.name, dict(e.attributes)) for e in user.events] == [("halfway", {"done": 1})]
    assert (user.instrumentation_scope.name, user.instrumentation_scope.version) == (
        "user-code", "1.0")
    assert attempt.start_time <= user.start_time <= user.end_time <= attempt.end_time


def test_spans_of_a_processes_worker_reach_the_exporter_the_otel_variables_name(
        tmp_path: Path) -> None:
    code = f"""
from tests.observability.test_otel import global_span
run = global_span.run(store={str(tmp_path / "l.duckdb")!r}, executor="processes", workers=1)
assert run.state == "succeeded", run.state
"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEDGERFLOW_", "OTEL_", "OPENLINEAGE"))}
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="flows")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=180, cwd=Path(__file__).parents[2])
    assert res.returncode == 0, res.stderr
    docs = {d["name"]: d for d in _json_objects(res.stdout)}
    attempt, user = docs["task opens_global_span"], docs["user work"]
    assert user["parent_id"] == attempt["context"]["span_id"]
    assert user["context"]["trace_id"] == attempt["context"]["trace_id"]
    assert user["resource"]["attributes"]["service.name"] == "flows"


def test_a_program_task_gets_its_attempt_as_traceparent(spans: Any, ledger: str) -> None:
    show = ledgerflow.program("show", [sys.executable, "-c",
                                       "import os; print(os.environ['TRACEPARENT'])"])

    @pipeline
    def prog():
        return show()

    run = prog.run(store=ledger, executor="threads")
    assert run.state == "succeeded"
    (attempt,) = _by_name(spans.get_finished_spans())["task show"]
    ctx = attempt.context
    version, trace_id, span_id, _flags = run.result()["stdout"].strip().split("-")
    assert (version, trace_id, span_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")


def test_model_and_tool_calls_are_gen_ai_child_spans_of_the_attempt(spans: Any,
                                                                     ledger: str) -> None:
    run = agent.run(store=ledger, executor="threads")
    assert run.result() == "answer to what?"
    got = _by_name(spans.get_finished_spans())
    (attempt,) = got["task agent_step"]
    first, second = sorted(got["chat fake-model"], key=lambda s: s.start_time)
    (tool,) = got["execute_tool search_index"]
    for s in (first, second, tool):
        assert s.parent.span_id == attempt.context.span_id
        assert s.attributes["ledgerflow.task_key"] == "agent_step"
    a = first.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "fake"
    assert a["gen_ai.request.model"] == "fake-model"
    assert a["gen_ai.request.max_tokens"] == 64
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (21, 5)
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert a["gen_ai.response.id"] == "resp-1"
    assert first.kind.name == "CLIENT"
    t = tool.attributes
    assert (t["gen_ai.operation.name"], t["gen_ai.tool.name"], t["gen_ai.tool.call.id"]) == (
        "execute_tool", "search_index", "call_0_0")
    # usage also reaches the ledger, with the attempt (the lineage row of the model)
    (row,) = [r for r in run.lineage() if r["uri"] == "model:fake/fake-model"]
    assert row["attrs"] == {"kind": "model", "provider": "fake", "model": "fake-model",
                            "calls": "2", "input_tokens": "51", "output_tokens": "12",
                            "cost_usd": "0.001"}


def test_a_failed_model_call_is_an_error_span_and_the_error_reaches_the_task(
        spans: Any, ledger: str) -> None:
    @task(cache=False)
    def refused() -> int:
        with genai.model_call("fake", "m"):
            raise ConnectionError("429")

    @pipeline
    def p():
        return refused()

    run = p.run(store=ledger, executor="inline")
    assert run.state == "failed"
    assert run.attempts()[0]["error_type"] == "ConnectionError"
    (call,) = _by_name(spans.get_finished_spans())["chat m"]
    assert call.status.status_code == StatusCode.ERROR
    assert call.attributes["error.type"] == "ConnectionError"


def test_the_gen_ai_names_are_the_semantic_conventions() -> None:
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as g
    from opentelemetry.semconv.attributes import error_attributes as e

    from ledgerflow_observability._otel import GEN_AI
    known = {v for k, v in vars(g).items() if k.startswith("GEN_AI_")} | {e.ERROR_TYPE}
    assert set(GEN_AI.values()) <= known


def test_no_span_and_no_import_when_off(ledger: str) -> None:
    code = f"""
import sys
from ledgerflow import task, pipeline
@task
def one() -> int:
    return 1
@pipeline
def p():
    return one()
run = p.run(store={ledger!r}, executor="threads")
assert run.state == "succeeded", run.state
assert run._runner.hook_records is None and run._runner.hook_carrier is None
heavy = [m for m in ("opentelemetry", "openlineage", "prometheus_client") if m in sys.modules]
print(heavy)
"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEDGERFLOW_", "OTEL_", "OPENLINEAGE"))}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_the_standard_otel_variables_turn_it_on(tmp_path: Path) -> None:
    code = f"""
from ledgerflow import task, pipeline
@task
def one() -> int:
    return 1
@pipeline
def p():
    return one()
assert p.run(store={str(tmp_path / "l.duckdb")!r}).state == "succeeded"
"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEDGERFLOW_", "OTEL_", "OPENLINEAGE"))}
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="flows")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    docs = _json_objects(res.stdout)
    names = {d["name"] for d in docs}
    assert {"run p", "task one"} <= names
    assert all(d["resource"]["attributes"]["service.name"] == "flows" for d in docs)
    env["LEDGERFLOW_OTEL"] = "0"             # ours wins over OTEL_*
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert _json_objects(res.stdout) == []


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects ConsoleSpanExporter printed, one after another."""
    dec = json.JSONDecoder()
    out, i = [], 0
    text = text.strip()
    while i < len(text):
        obj, end = dec.raw_decode(text, i)
        out.append(obj)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return out
