"""The console's page models and HTML in-process: the timeline's aggregation and bar
widths, escaping, and the panels (logs, approvals, usage) lighting up as soon as
``Run`` has the methods the kernel is gaining."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any
from urllib.parse import urlsplit

import pytest

import ledgerflow
from ledgerflow import Run, context, pipeline, task
from ledgerflow.views import RunView, TaskRow, usage_summary

app_mod = pytest.importorskip("ledgerflow_console.app")
from ledgerflow_console import pages, views  # noqa: E402


def _view(n: int, *, retried: int = 0, t0: float = 1000.0) -> tuple[RunView, list[dict[str, Any]]]:
    """A run of ``n`` fan-out items taking 30 µs each; the first ``retried`` failed once."""
    tasks, attempts = {}, []
    for i in range(n):
        key = f"embed[{i}]"
        start = t0 + i * 0.001
        tasks[key] = TaskRow(key, task_name="embed", node="embed", item_key=str(i), position=i,
                             state="succeeded", attempts=2 if i < retried else 1,
                             started_at=start, ended_at=start + 0.01)
        if i < retried:
            attempts.append({"task_key": key, "attempt": 1, "outcome": "error",
                             "started_at": start, "ended_at": start + 0.00003,
                             "error_type": "OSError", "error_message": "flaky disk"})
            start += 0.005
        attempts.append({"task_key": key, "attempt": 2 if i < retried else 1, "outcome": "ok",
                         "started_at": start, "ended_at": start + 0.00003,
                         "error_type": "", "error_message": ""})
    return RunView("r1", pipeline="p", state="succeeded", created_at=t0, ended_at=t0 + n,
                   tasks=tasks), attempts


def test_small_timelines_draw_one_bar_per_attempt_at_least_two_pixels_wide() -> None:
    view, attempts = _view(50, retried=3)
    tl = views.timeline(view, attempts, rows=300)
    assert not tl["aggregated"] and tl["attempts_total"] == 53
    html = pages.timeline_html("r1", tl)
    bars = re.findall(r'<rect class="attempt[^"]*" data-task="([^"]+)" data-attempt="(\d+)"'
                      r'.*? width="([\d.]+)"', html)
    assert len(bars) == 53
    assert [a for k, a, _ in bars if k == "embed[0]"] == ["1", "2"]
    assert min(float(w) for _, _, w in bars) >= pages.MIN_BAR_W
    assert html.count('class="wait"') == 3           # the wait before each retry


def test_large_timelines_are_aggregated_by_task_name_keeping_the_retried_tasks() -> None:
    view, attempts = _view(5000, retried=7)
    tl = views.timeline(view, attempts, rows=100, buckets=50)
    assert tl["aggregated"] and tl["lanes_total"] == 5000
    (group,) = tl["groups"]
    assert group["task"] == "embed" and group["tasks"] == 5000
    assert group["attempts"] == 5007 and group["outcomes"] == {"ok": 5000, "error": 7}
    assert len(group["buckets"]) <= 50
    assert sum(b["n"] for b in group["buckets"]) >= 5007
    assert [x["task_key"] for x in tl["lanes"]] == [f"embed[{i}]" for i in range(7)]
    html = pages.timeline_html("r1", tl)
    assert html.count('class="attempt') == 14 and html.count('class="cell"') == len(
        group["buckets"])
    assert len(html) < 100_000


def test_every_ledger_value_is_escaped() -> None:
    key = 'x[<script>alert(1)</script>"]'
    view = RunView("r1", pipeline="<b>p</b>", state="failed", created_at=1.0, tasks={
        key: TaskRow(key, task_name="<i>t</i>", state="failed", attempts=1, started_at=1.0,
                     ended_at=2.0, error="ValueError: <img src=x onerror=alert(1)>")})
    attempts = [{"task_key": key, "attempt": 1, "outcome": "error", "started_at": 1.0,
                 "ended_at": 2.0, "error_type": "ValueError", "error_message": "<img>"}]
    model = {"header": views.run_header(view), "root_cause": views.root_cause(view),
             "groups": views.groups(view), "timeline": views.timeline(view, attempts),
             "notices": [{"task_key": key, "attempt": 1, "kind": "<k>", "message": "<m>",
                          "at": 1.0}]}
    ctx = pages.Ctx(store="<store>", actions=True, token="t")
    html = pages.run_page(ctx, model, "/runs/r1?part=live")
    body = html.split("<script>")[0]
    assert "<script>alert" not in body and "<img" not in body and "<b>p" not in body
    assert "&lt;script&gt;" in body and "&lt;img src=x" in body


def test_usage_totals_accept_the_shapes_a_usage_report_may_have() -> None:
    rows = [{"model": "m", "input_tokens": 10, "output_tokens": 5, "cost": 0.5},
            {"model": "m", "total_tokens": 7, "input_tokens": 4, "cost_usd": 0.25}]
    assert views.usage_totals(rows) == {"tokens": 22, "cost": 0.75, "calls": 2}
    nested = {"by_task": {"a": {"total_tokens": 3, "calls": 2}}, "total_tokens": 3}
    assert views.usage_totals(nested)["tokens"] == 6
    assert views.usage_totals(None) is None


def test_usage_totals_of_a_usage_summary_count_each_call_once() -> None:
    calls = [{"task_key": t, "provider": "mock", "model": "m", "key_alias": None,
              "input_tokens": 10, "output_tokens": 5, "cost": 0.5, "replayed": False}
             for t in ("a", "b")]
    assert views.usage_totals(usage_summary(calls)) == {"tokens": 30, "cost": 1.0, "calls": 2}
    assert views.usage_totals(usage_summary([])) == {"tokens": 0, "cost": 0.0, "calls": 0}


# -- the panels light up when Run has the methods ---------------------------------------

@task(retries=1)
def shaky(n: int) -> int:
    if context().attempt == 1:
        raise RuntimeError("first try fails")
    return n


@pipeline
def gated(n: int = 2):
    return shaky(n)


class Asgi:
    """Call an ASGI app in-process (no HTTP client library needed)."""

    def __init__(self, app: Any, host: str = "127.0.0.1:8765") -> None:
        self.app, self.host = app, host

    def __call__(self, method: str, url: str, body: object = None,
                 headers: dict[str, str] | None = None) -> tuple[int, str]:
        parts = urlsplit(url)
        raw = b"" if body is None else json.dumps(body).encode()
        hdrs = [(b"host", self.host.encode())] + [
            (k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": parts.path,
                 "raw_path": parts.path.encode(), "query_string": parts.query.encode(),
                 "root_path": "", "headers": hdrs, "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8765)}
        out: dict[str, Any] = {"body": b""}

        async def go() -> None:
            sent = False

            async def receive() -> dict[str, Any]:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": raw, "more_body": False}
                await asyncio.sleep(3600)
                return {"type": "http.disconnect"}

            async def send(msg: dict[str, Any]) -> None:
                if msg["type"] == "http.response.start":
                    out["status"] = msg["status"]
                elif msg["type"] == "http.response.body":
                    out["body"] += msg.get("body", b"")

            await self.app(scope, receive, send)

        failed: list[BaseException] = []

        def in_thread() -> None:     # a loop of its own, whatever runs in this thread
            try:
                asyncio.run(go())
            except BaseException as exc:
                failed.append(exc)

        t = threading.Thread(target=in_thread)
        t.start()
        t.join(60)
        if failed:
            raise failed[0]
        return out["status"], out["body"].decode()


def test_logs_approvals_and_usage_panels_appear_once_run_has_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = "memory:console-panels"
    rid = gated.run(store=store, executor="inline").run_id
    calls: list[tuple[Any, ...]] = []

    def logs(self: Run, task_key: str, attempt: int | None = None) -> list[dict[str, Any]]:
        return [{"task_key": task_key, "attempt": a, "stream": s,
                 "text": f"{s} of attempt {a} <tag>\n", "dropped": 12 if a == 1 else 0}
                for a in (1, 2) if attempt in (None, a) for s in ("stdout", "stderr")]

    def approvals(self: Run) -> list[dict[str, Any]]:
        return [{"task_key": "shaky", "action": "publish", "summary": "n=2",
                 "digest": "ab12" * 16, "requested_at": 1.0, "deadline": None,
                 "state": "pending", "decided_by": None}]

    def usage(self: Run) -> list[dict[str, Any]]:
        return [{"task_key": "shaky", "model": "mock", "input_tokens": 30,
                 "output_tokens": 12, "cost": 0.002}]

    def approve(run_id: str, task_key: str, *, digest: str, reason: str | None = None,
                store: str | None = None) -> dict[str, Any]:
        calls.append((run_id, task_key, digest, reason, store))
        return {"state": "approved"}

    monkeypatch.setattr(Run, "logs", logs, raising=False)
    monkeypatch.setattr(Run, "approvals", approvals, raising=False)
    monkeypatch.setattr(Run, "usage", usage, raising=False)
    monkeypatch.setattr(ledgerflow, "approve", approve, raising=False)
    cfg = app_mod.ConsoleConfig(store=store, store_label=store, host="127.0.0.1", port=8765,
                                allow_actions=True, token="tok",
                                allowed_hosts=app_mod.allowed_hosts("127.0.0.1", 8765))
    call = Asgi(app_mod.create_app(cfg))

    status, html = call("GET", f"/runs/{rid}/inspect?task=shaky&attempt=2")
    assert status == 200
    assert "stderr of attempt 2 &lt;tag&gt;" in html and "of attempt 1" not in html
    status, html = call("GET", f"/runs/{rid}/inspect?task=shaky&attempt=1")
    assert "12 bytes dropped by the cap" in html
    status, doc = call("GET", f"/api/runs/{rid}/logs?task=shaky")
    assert status == 200 and len(json.loads(doc)) == 4

    status, html = call("GET", f"/runs/{rid}?token=tok")
    assert 'id="approvals"' in html and "Approvals (1 pending)" in html
    assert 'data-action="/api/runs/' + rid + '/approve"' in html and "ab12ab12ab12ab12" in html
    assert 'data-autoload="/runs/' + rid + '/usage"' in html
    status, html = call("GET", f"/runs/{rid}/usage")
    assert "<b>42</b> tokens" in html and "mock" in html

    runs = json.loads(call("GET", "/api/runs")[1])
    mine = next(r for r in runs if r["run_id"] == rid)
    assert mine["usage"] == {"tokens": 42, "cost": 0.002, "calls": 1}

    body = {"task_key": "shaky", "digest": "ab12" * 16, "reason": "looks right"}
    assert call("POST", f"/api/runs/{rid}/approve", body)[0] == 403          # no token
    status, doc = call("POST", f"/api/runs/{rid}/approve", body,
                       {"X-Ledgerflow-Token": "tok"})
    assert status == 200 and json.loads(doc)["decision"] == {"state": "approved"}
    assert calls == [(rid, "shaky", "ab12" * 16, "looks right", store)]
    status, doc = call("POST", f"/api/runs/{rid}/reject", {"task_key": "shaky"},
                       {"X-Ledgerflow-Token": "tok"})
    assert status == 400 and "needs a reason" in json.loads(doc)["error"]
