"""HTML renderers and the notebook progress display (ledgerflow.display)."""

from __future__ import annotations

import re
import time
from typing import Any

from ledgerflow import pipeline, task
from ledgerflow.display import STATE_COLOURS, NotebookProgress, graph_html, layers, run_html
from ledgerflow.views import RunView, TaskRow


@task
def load() -> list[int]:
    return [1, 2]


@task
def inc(x: int) -> int:
    return x + 1


@task(name="odd<name>&")
def odd(values: list[int]) -> int:
    return sum(values)


@task
def audit() -> str:
    return "ok"


@pipeline
def demo_pipe():
    first = audit()
    return odd(inc.map(load()), after=[first])


def _view() -> RunView:
    now = 1_800_000_000.0
    tasks = {
        "load": TaskRow("load", task_name="load", state="succeeded", attempts=1,
                        started_at=now, ended_at=now + 0.25),
        "inc[1]": TaskRow("inc[1]", task_name="inc", state="retry_wait", attempts=2,
                          upstream=["load"], error="ValueError: <script>alert(1)</script>"),
        "inc[2]": TaskRow("inc[2]", task_name="inc", state="running", attempts=1,
                          upstream=["load"], started_at=now),
        "odd<name>&": TaskRow("odd<name>&", task_name="odd<name>&", state="upstream_failed",
                              upstream=["inc[1]", "inc[2]"]),
        "cached": TaskRow("cached", state="succeeded", cached_from="r0/cached"),
        "boom": TaskRow("boom", state="failed", attempts=3, error="x" * 500),
    }
    return RunView("20261129-101010-abcdef", pipeline="demo<&>", state="failed",
                   reason="1 task failed", tasks=tasks)


def test_run_html_lists_every_task_with_its_state_and_colour() -> None:
    html = run_html(_view())
    assert "20261129-101010-abcdef" in html
    for state in ("succeeded", "retry_wait", "running", "upstream_failed", "failed"):
        assert f'data-state="{state}"' in html
        assert STATE_COLOURS[state] in html
    assert "load" in html and "inc[1]" in html
    assert "250 ms" in html                          # duration of load
    assert "(cached)" in html
    assert re.search(r"succeeded</span>&nbsp;2", html)   # counts per state


def test_run_html_escapes_user_text() -> None:
    html = run_html(_view())
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "odd&lt;name&gt;&amp;" in html and "odd<name>" not in html
    assert "demo&lt;&amp;&gt;" in html
    assert "x" * 201 not in html.split('title="')[0]   # long errors are shortened ...
    assert "x" * 500 in html                            # ... but kept whole in the tooltip


def test_run_html_without_tasks_and_without_graph() -> None:
    html = run_html(RunView("r1", pipeline="p", state="running"), graph=False)
    assert "0 tasks" in html and "<svg" not in html


def test_graph_html_is_inline_svg_with_all_nodes_escaped() -> None:
    html = graph_html(demo_pipe.build())
    assert html.count("<svg") == 1 and "</svg>" in html
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # offline
    for key in ("load", "inc [map]", "audit", "odd&lt;name&gt;&amp;"):
        assert key in html
    assert "odd<name>" not in html
    assert "stroke-dasharray" in html                   # the after= edge
    assert html.count("marker-end=") == 3      # load->inc, inc->odd, audit->odd


def test_graph_html_colours_nodes_by_state() -> None:
    html = graph_html(demo_pipe.build(), states={"load": "failed"})
    assert STATE_COLOURS["failed"] in html


def test_pipeline_and_run_repr_html() -> None:
    assert "<svg" in demo_pipe._repr_html_()
    run = demo_pipe.run(store="memory:test_display", executor="inline")
    html = run._repr_html_()
    assert run.run_id in html and "succeeded" in html
    for key in ("load", "audit", "odd&lt;name&gt;&amp;"):
        assert key in html


def test_layers_by_longest_path_and_cycle_safe() -> None:
    edges = [("a", "b", "data"), ("a", "c", "data"), ("b", "d", "data"), ("c", "d", "data"),
             ("a", "d", "after")]
    assert layers(["d", "c", "b", "a"], edges) == [["a"], ["c", "b"], ["d"]]
    got = layers(["x", "y"], [("x", "y", "data"), ("y", "x", "data")])
    assert sorted(k for layer in got for k in layer) == ["x", "y"]


class _Handle:
    def __init__(self) -> None:
        self.updates: list[str] = []

    def update(self, obj: Any) -> None:
        self.updates.append(obj)


def _attached(interval: float) -> tuple[NotebookProgress, _Handle]:
    p = NotebookProgress("demo", interval=interval, display=False)
    h = _Handle()
    p._handle, p._HTML = h, str   # what display=True sets up inside IPython
    return p, h


def test_progress_is_silent_outside_ipython() -> None:
    p = NotebookProgress()
    for i in range(3):
        p(f"t{i}", "", "pending")
        p(f"t{i}", "pending", "running")
    p("t0", "running", "succeeded")
    p("t1", "running", "failed")
    assert p.counts() == {"total": 3, "done": 1, "running": 1, "failed": 1, "cancelled": 0,
                          "waiting": 0}
    assert p.text().startswith("1/3 done, 1 running, 1 failed")
    p.close()


def test_progress_throttles_and_draws_the_final_state() -> None:
    p, h = _attached(interval=10.0)
    for i in range(200):
        p(f"t{i}", "", "pending")
    for i in range(200):
        p(f"t{i}", "pending", "running")
    assert len(h.updates) == 1                 # one draw per interval at most
    for i in range(200):
        p(f"t{i}", "running", "succeeded")
    assert len(h.updates) == 2                 # all terminal: drawn at once
    assert "200/200 done" in h.updates[-1]
    p.close()


def test_progress_trailing_redraw() -> None:
    p, h = _attached(interval=0.05)
    p("a", "", "pending")
    p("a", "pending", "running")               # throttled; a timer redraws it
    deadline = time.monotonic() + 5
    while not any("1 running" in u for u in h.updates) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "1 running" in h.updates[-1]
    p.close()


def test_progress_survives_a_broken_display() -> None:
    p, _ = _attached(interval=0.0)

    class Broken:
        def update(self, obj: Any) -> None:
            raise RuntimeError("display gone")

    p._handle = Broken()
    p("a", "", "succeeded")                    # must not raise
    assert p._handle is None
