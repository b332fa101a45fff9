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
