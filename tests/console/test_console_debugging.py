"""The console as people debugging need it, in-process on real runs: each attempt's
traceback, the run's parameters and trigger, the layered graph of a large fan-out,
agent calls in detail, and starting a run of a known pipeline."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from ledgerflow import context, pipeline, task

app_mod = pytest.importorskip("ledgerflow_console.app")
from tests.console.test_console_views import Asgi  # noqa: E402


@task(retries=1)
def wobbly(n: int, label: str) -> int:
    print(f"wobbly attempt {context().attempt} <b>")
    if context().attempt == 1:
        raise KeyError(f"missing <{label}>")
    return n


@pipeline
def wobbly_flow(n: int = 2, label: str = "x"):
    return wobbly(n, label)


def _console(store: str, **kw: Any) -> Asgi:
    cfg = app_mod.ConsoleConfig(store=store, store_label=store, host="127.0.0.1", port=8765,
                                allowed_hosts=app_mod.allowed_hosts("127.0.0.1", 8765), **kw)
    return Asgi(app_mod.create_app(cfg))


def test_each_attempts_traceback_is_on_the_task_page_escaped() -> None:
    store = "memory:console-traceback"
    rid = wobbly_flow.run(store=store, executor="inline", n=3, label="<i>").run_id
    call = _console(store)
    status, html = call("GET", f"/runs/{rid}/inspect?task=wobbly&attempt=1")
    assert status == 200
    tbs = re.findall(r'<details class="traceback" data-attempt="(\d+)"( open)?>.*?<pre>(.*?)'
                     r"</pre>", html, re.S)
    assert [(n, bool(o)) for n, o, _ in tbs] == [("1", True)]   # attempt 2 succeeded
    text = tbs[0][2]
    assert "Traceback (most recent call last)" in text and "in wobbly" in text
    assert "KeyError: &#x27;missing &lt;&lt;i&gt;&gt;&#x27;" in text or \
        "missing &lt;&lt;i&gt;&gt;" in text
    assert "<i>" not in html
    # the logs of the chosen attempt, escaped, next to it
    assert "wobbly attempt 1 &lt;b&gt;" in html


def test_the_runs_and_the_run_page_show_parameters_and_trigger() -> None:
    store = "memory:console-params"
    rid = wobbly_flow.run(store=store, executor="inline", n=7, label="big day").run_id
    call = _console(store)
    page = json.loads(call("GET", f"/api/runs/{rid}/page")[1])
    assert page["header"]["params"] == {"n": 7, "label": "big day"}
    assert page["header"]["trigger"] is None
    runs = json.loads(call("GET", "/api/runs")[1])
    assert runs[0]["params"] == {"n": 7, "label": "big day"} and runs[0]["trigger"] is None
    html = call("GET", f"/runs/{rid}")[1]
    params = re.search(r'<div id="run-params".*?</table>', html, re.S)
    assert params is not None
    assert '<tr data-param="n"><td class="mono">n</td><td class="mono">7</td>' in params[0]
    assert "&quot;big day&quot;" in params[0] and "manual" in params[0]
    html = call("GET", "/")[1]
    cell = re.search(r'<td class="mono params">(.*?)</td>', html)
    assert cell is not None and cell[1] in ('n=7 label=&quot;big day&quot;',
                                            'label=&quot;big day&quot; n=7')
    assert '<td class="trigger">manual</td>' in html


@task
def part(i: int) -> int:
    return i


@task
def part_fails(i: int) -> int:
    if i % 50 == 7:
        raise ValueError(f"item {i} is bad")
    return i


@task
def gather(xs: list[int]) -> int:
    return len(xs)


@pipeline
def fan(n: int = 33):
    return gather(part_fails.map(part.map(list(range(n)))))


def _graph(call: Asgi, rid: str) -> tuple[dict[str, Any], str]:
    model = json.loads(call("GET", f"/api/runs/{rid}/graph")[1])
    status, svg = call("GET", f"/runs/{rid}/graph.svg")
    assert status == 200
    return model, svg


@pytest.mark.parametrize("n", [33, 500])
def test_the_graph_is_layered_with_fan_outs_folded_and_stays_page_wide(n: int) -> None:
    from ledgerflow_console.charts import GRAPH_W
    store = f"memory:console-fan-{n}"
    rid = fan.run(store=store, executor="inline", n=n).run_id
    model, svg = _graph(_console(store), rid)
    assert len(model["nodes"]) == 3                    # part xN, part_fails xN, gather
    by = {x["label"].split(" ")[0]: x for x in model["nodes"]}
    assert by["part"]["tasks"] == n and by["part"]["counts"] == {"succeeded": n}
    bad = len([i for i in range(n) if i % 50 == 7])
    assert by["part_fails"]["counts"] == {"succeeded": n - bad, "failed": bad}
    assert by["part_fails"]["state"] == "failed"
    width = float(re.search(r'<svg id="graph-svg"[^>]* width="([\d.]+)"', svg)[1])
    assert width <= GRAPH_W + 20
    depth = dict(re.findall(r'data-key="([^"]+)" data-state="[^"]+" data-tasks="\d+" '
                            r'data-depth="(\d+)"', svg))
    assert sorted(depth.values()) == ["0", "1", "2"]         # three layers, one node each
    assert svg.count('class="edge"') == 2
    bars = re.findall(r'class="state-bar" data-state="(\w+)"', svg)
    assert "failed" in bars and "succeeded" in bars
    assert f"part {chr(0xd7)}{n:,}" in svg


def test_a_small_fan_out_keeps_a_node_per_item() -> None:
    store = "memory:console-fan-small"
    rid = fan.run(store=store, executor="inline", n=4).run_id
    model, svg = _graph(_console(store), rid)
    assert len(model["nodes"]) == 9 and model["fanouts_collapsed"] == 0
    assert ("part[0]", "part_fails[0]") in {(x["from"], x["to"]) for x in model["edges"]}
    assert 'data-key="part[3]"' in svg and "/inspect?task=part%5B3%5D" in svg


# -- agent runs ---------------------------------------------------------------------------

def _agent_flow(record: bool) -> Any:
    from ledgerflow_agents import MockModel, agent_task, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        return a + b

    mock = MockModel(turns=[
        {"tool_calls": [{"name": "rm_rf", "arguments": {"path": "/"}}]},
        {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}],
         "usage": {"input_tokens": 120, "output_tokens": 18}},
        {"text": "the sum is <3>"}])

    @agent_task(model=mock, tools=[add], record_content=record)
    def adder(question: str) -> str:
        return question

    @pipeline
    def agent_flow():
        return adder("what is 1 + 2?")

    return agent_flow


def test_an_agent_runs_calls_show_prompt_answer_arguments_result_and_refusal() -> None:
    pytest.importorskip("ledgerflow_agents")
    store = "memory:console-agent"
    rid = _agent_flow(True).run(store=store).run_id
    call = _console(store)
    rows = json.loads(call("GET", f"/api/runs/{rid}/calls")[1])
    assert [(r["kind"], r.get("tool") or r.get("model")) for r in rows] == [
        ("model", "mock/mock-model"), ("tool", "rm_rf"), ("model", "mock/mock-model"),
        ("tool", "add"), ("model", "mock/mock-model")]
    first, refused, _, added, last = rows
    assert first["prompt"] == [{"role": "user", "name": None, "text": "what is 1 + 2?"}]
    assert refused["outcome"] == "refused" and refused["arguments"] == '{"path": "/"}'
    assert "not allowed" in refused["result"]
    assert added["outcome"] == "ok" and added["arguments"] == '{"a": 1, "b": 2}'
    assert added["result"] == "3"
    assert last["answer"] == "the sum is <3>" and rows[2]["input_tokens"] == 120
    html = call("GET", f"/runs/{rid}/usage")[1]
    assert "<th class=num>input tokens</th>" in html and "input_tokens" not in html
    assert "the sum is &lt;3&gt;" in html and "<3>" not in html
    # a call that only asked for tools says so, not an empty black box
    assert "no text: it asked for rm_rf" in html and "no text: it asked for add" in html
    assert '<pre class="answer"></pre>' not in html
    assert 'data-kind="tool" data-task="adder" data-seq="2" data-outcome="refused"' in html
    assert 'data-autoload="/runs/' + rid + '/usage"' in call("GET", f"/runs/{rid}")[1]


def test_unrecorded_calls_say_so_and_runs_without_calls_show_no_usage() -> None:
    pytest.importorskip("ledgerflow_agents")
    store = "memory:console-agent-bare"
    rid = _agent_flow(False).run(store=store).run_id
    call = _console(store)
    html = call("GET", f"/runs/{rid}/usage")[1]
    assert "prompt and answer not recorded" in html and "arguments not recorded" in html
    plain = wobbly_flow.run(store=store, executor="inline").run_id
    assert call("GET", f"/runs/{plain}/usage")[1] == ""
    page = call("GET", f"/runs/{plain}")[1]
    assert "/usage" not in page and "Model and tool calls" not in page


# -- approvals: what is being approved ----------------------------------------------------

def test_a_task_gates_request_shows_argument_values_note_and_approvers() -> None:
    from ledgerflow import Approval

    @task
    def build(n: int) -> list[int]:
        return list(range(n))

    @task(approve=Approval(approvers=["ana", "bo"], note="check the <target> first"))
    def publish(xs: list[int], target: str) -> int:
        return len(xs)

    @pipeline
    def gated_flow(n: int = 3, target: str = "prod"):
        return publish(build(n), target)

    store = "memory:console-gate"
    rid = gated_flow.run(store=store, executor="inline", target="<prod>").run_id
    html = _console(store)("GET", f"/runs/{rid}")[1]
    assert '<tr class="request" data-request-for="publish">' in html
    text = html[html.index('<tr class="request"'):html.index("</table>", html.index(
        '<table class="arguments">'))]
    assert "check the &lt;target&gt; first" in text and "ana, bo" in text
    assert re.search(r'data-arg="target"><td class="mono">target</td><td class="mono">'
                     r"[^<]*&lt;prod&gt;", text)
    assert re.search(r'data-arg="xs">.*?\[0, 1, 2\]', text)


def test_a_recorded_trigger_is_shown_on_the_runs_and_the_run_page() -> None:
    from ledgerflow.views import RunView
    from ledgerflow_console import pages, views
    trig = {"kind": "files", "paths": ["docs/a.md", "docs/b.md", "docs/c.md", "docs/d.md"],
            "changes": 5, "slot": None, "missed": 0, "watcher_pid": 4242}
    v = RunView("r1", pipeline="index", target="flows.py:index", params='{"root": "docs"}',
                options=json.dumps({"trigger": trig}), created_at=1000.0, state="succeeded",
                ended_at=1001.0)
    model = views.runs_page([v], state=None, pipeline=None, extras={}, now=1002.0)
    assert model["runs"][0]["trigger"] == trig
    ctx = pages.Ctx(store="s", actions=False)
    html = pages.runs_table(ctx, model, "/?part=live")
    assert ('<td class="trigger">files: 5 changes (docs/a.md, docs/b.md, docs/c.md ...)</td>'
            in html)
    head = views.run_header(v, now=1002.0)
    assert head["trigger"] == trig and head["params"] == {"root": "docs"}
    box = pages.params_html(head)
    assert "files: 5 changes" in box and "flows.py:index" in box
    cron = {"kind": "cron", "paths": [], "changes": 0, "slot": "2026-12-02T08:00:00Z",
            "missed": 2}
    assert views.trigger_text(cron) == "cron slot 2026-12-02T08:00:00Z, 2 missed"
