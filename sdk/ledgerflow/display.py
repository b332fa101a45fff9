"""Rich display for notebooks: run tables, graph drawings and a live progress line.

Everything renders to self-contained HTML (inline SVG for graphs, no scripts,
no internet). All text from the ledger or from user code is escaped.

Example:
    >>> from ledgerflow.views import RunView, TaskRow
    >>> view = RunView("r1", pipeline="p", state="succeeded",
    ...                tasks={"a": TaskRow("a", state="succeeded", attempts=1)})
    >>> "succeeded" in run_html(view)
    True
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from .graph import Graph
from .states import IN_FLIGHT, TERMINAL, TaskState
from .views import RunView, TaskRow

_T = TaskState

#: Background colour of each task (and run) state.
STATE_COLOURS: dict[str, str] = {
    _T.PENDING: "#e5e7eb",
    _T.READY: "#dbeafe",
    _T.RUNNING: "#93c5fd",
    _T.RETRY_WAIT: "#fde68a",
    _T.CANCELLING: "#fed7aa",
    _T.SUCCEEDED: "#bbf7d0",
    _T.FAILED: "#fecaca",
    _T.CANCELLED: "#d6d3d1",
    _T.UPSTREAM_FAILED: "#fbcfe8",
}
_DEFAULT_COLOUR = "#f3f4f6"
_ORDER = (_T.SUCCEEDED, _T.RUNNING, _T.RETRY_WAIT, _T.READY, _T.PENDING, _T.CANCELLING,
          _T.FAILED, _T.UPSTREAM_FAILED, _T.CANCELLED)
_FONT = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px"
_MAX_ERROR = 200
_MAX_SVG_NODES = 150


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _pill(state: str) -> str:
    colour = STATE_COLOURS.get(state, _DEFAULT_COLOUR)
    return (f'<span style="background:{colour};color:#111;border-radius:8px;'
            f'padding:1px 7px">{_e(state)}</span>')


def _duration(row: TaskRow) -> str:
    if row.started_at is None or row.ended_at is None:
        return ""
    secs = max(0.0, row.ended_at - row.started_at)
    if secs < 1:
        return f"{secs * 1000:.0f} ms"
    if secs < 120:
        return f"{secs:.2f} s"
    return f"{secs / 60:.1f} min"


def _counts_html(counts: Mapping[str, int]) -> str:
    keys = [s for s in _ORDER if s in counts] + sorted(set(counts) - set(_ORDER))
    return " ".join(f"{_pill(s)}&nbsp;{counts[s]}" for s in keys)


#: Above this many tasks the notebook table shows one row per task name.
ROW_LIMIT = 50


def run_html(view: RunView, *, graph: bool = True, all_rows: bool = False,
             approvals: Sequence[Mapping[str, Any]] = ()) -> str:
    """Render a run as HTML: state, counts, the task table (and its graph).

    Args:
        view: the run as read from a store (``Run.status()``).
        graph: also draw the run's task graph (collapsed) when it is small.
        all_rows: one row per task even above :data:`ROW_LIMIT` tasks (default:
            one row per task name there; ``run.tasks()`` lists them all).
        approvals: pending approval requests, shown as a table first.
    """
    pending = approvals_html(view.run_id, approvals) if approvals else ""
    if len(view.tasks) > ROW_LIMIT and not all_rows:
        return _aggregated_html(view).replace('<div class="ledgerflow-run">',
                                              '<div class="ledgerflow-run">' + pending, 1)
    counts = view.counts()
    head = (f'<div style="{_FONT}"><b>run {_e(view.run_id)}</b> of pipeline '
            f'<b>{_e(view.pipeline)}</b>: {_pill(view.state)}'
            + (f" <i>{_e(view.reason)}</i>" if view.reason else "")
            + f" &middot; {len(view.tasks)} tasks &middot; {_counts_html(counts)}</div>")
    cells = ("task key", "state", "attempts", "duration", "error")
    th = "".join(f'<th style="text-align:left;padding:2px 8px">{c}</th>' for c in cells)
    rows = []
    for row in view.tasks.values():
        err = "" if row.state == _T.SUCCEEDED else row.error or ""   # a lost try, recovered
        short = err if len(err) <= _MAX_ERROR else err[:_MAX_ERROR] + "…"
        cached = ' <span title="result reused from an earlier run">(cached)</span>' \
            if row.cached_from else ""
        td = 'style="padding:2px 8px;vertical-align:top"'
        rows.append(
            f'<tr data-state="{_e(row.state)}"><td {td}>{_e(row.key)}</td>'
            f"<td {td}>{_pill(row.state)}{cached}</td>"
            f'<td {td}>{row.attempts}</td><td {td}>{_e(_duration(row))}</td>'
            f'<td {td} title="{_e(err)}">{_e(short)}</td></tr>')
    table = (f'<table style="{_FONT};border-collapse:collapse">'
             f"<thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    extra = ""
    if graph and 0 < len(view.tasks) <= _MAX_SVG_NODES:
        extra = ("<details><summary>graph</summary>"
                 + view_graph_html(view) + "</details>")
    return f'<div class="ledgerflow-run">{pending}{head}{table}{extra}</div>'


def approvals_html(run_id: str, approvals: Sequence[Mapping[str, Any]]) -> str:
    """Pending approval requests as a table, with how to decide each."""
    td = 'style="padding:2px 8px;vertical-align:top"'
    th = "".join(f'<th style="text-align:left;padding:2px 8px">{c}</th>'
                 for c in ("task", "action", "summary", "digest", "deadline"))
    rows = []
    for r in list(approvals)[:200]:
        deadline = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["deadline"])) \
            if r.get("deadline") else "-"
        rows.append(f"<tr><td {td}>{_e(r['task_key'])}</td><td {td}>{_e(r['action'])}</td>"
                    f"<td {td}>{_e(r['summary'])}</td><td {td}><code>"
                    f"{_e(r['digest'][:12])}</code></td><td {td}>{_e(deadline)}</td></tr>")
    more = f"<div>and {len(approvals) - 200} more</div>" if len(approvals) > 200 else ""
    first = approvals[0]
    how = (f"<code>run.approve({first['task_key']!r}, digest={first['digest'][:12]!r})</code>"
           f" or <code>pipeline approve {run_id} '{first['task_key']}' --digest "
           f"{first['digest'][:12]}</code>, then resume")
    return (f'<div style="{_FONT};background:#fef9c3;padding:4px 8px;margin-bottom:6px">'
            f"<b>{len(approvals)} approval(s) waiting</b><table style=\"border-collapse:"
            f'collapse"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f"{more}<div>decide: {how}</div></div>")


def _aggregated_html(view: RunView) -> str:
    """A big run: its head, then one row per task name with counts by state."""
    counts = view.counts()
    head = (f'<div style="{_FONT}"><b>run {_e(view.run_id)}</b> of pipeline '
            f'<b>{_e(view.pipeline)}</b>: {_pill(view.state)}'
            + (f" <i>{_e(view.reason)}</i>" if view.reason else "")
            + f" &middot; {len(view.tasks)} tasks &middot; {_counts_html(counts)}</div>")
    by_name: dict[str, list[TaskRow]] = {}
    for row in view.tasks.values():
        by_name.setdefault(row.task_name or row.key, []).append(row)
    td = 'style="padding:2px 8px;vertical-align:top"'
    rows = []
    for name, group in by_name.items():
        states: dict[str, int] = {}
        for r in group:
            states[r.state] = states.get(r.state, 0) + 1
        first = next((r for r in group if r.error and r.state != _T.SUCCEEDED), None)
        err = f"{first.key}: {first.error}" if first else ""
        short = err if len(err) <= _MAX_ERROR else err[:_MAX_ERROR] + "…"
        cached = sum(1 for r in group if r.cached_from)
        rows.append(f"<tr><td {td}>{_e(name)} &times; {len(group)}</td>"
                    f"<td {td}>{_counts_html(states)}</td><td {td}>{cached}</td>"
                    f'<td {td} title="{_e(err)}">{_e(short)}</td></tr>')
    th = "".join(f'<th style="text-align:left;padding:2px 8px">{c}</th>'
                 for c in ("task", "states", "cached", "first error"))
    note = (f'<div style="{_FONT};color:#555">one row per task name above {ROW_LIMIT} tasks; '
            "every task: <code>run.tasks()</code> or <code>run_html(view, all_rows=True)"
            "</code></div>")
    return (f'<div class="ledgerflow-run">{head}<table style="{_FONT};'
            f'border-collapse:collapse"><thead><tr>{th}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>{note}</div>")


# -- graphs ------------------------------------------------------------------------------

def graph_html(graph: Graph, states: Mapping[str, str] | None = None) -> str:
    """Render a pipeline graph as inline SVG (laid out by topological depth).

    Map nodes are drawn stacked; ``after=`` edges dashed. ``states`` (node key ->
    state) colours the nodes. Large graphs fall back to a text listing.
    """
    nodes = [(n.key, n.key + (" [map]" if n.is_map else ""), n.is_map) for n in graph]
    edges = [(u, v, kind) for u, v, kind in graph.edges()]
    title = f"pipeline {graph.name}: {len(graph)} nodes"
    if len(nodes) > _MAX_SVG_NODES:
        return (f'<div style="{_FONT}"><b>{_e(title)}</b><pre>{_e(graph.to_text())}</pre>'
                "</div>")
    return (f'<div class="ledgerflow-graph" style="{_FONT}"><b>{_e(title)}</b><br>'
            + svg_graph(nodes, edges, states or {}) + "</div>")


def view_graph_html(view: RunView) -> str:
    """Draw a run's expanded tasks (one node per task, fan-outs included) as SVG."""
    nodes = [(r.key, r.key, False) for r in view.tasks.values()]
    edges = [(u, r.key, "data") for r in view.tasks.values() for u in r.upstream
             if u in view.tasks]
    states = {r.key: r.state for r in view.tasks.values()}
    return svg_graph(nodes, edges, states)


def layers(keys: Sequence[str], edges: Iterable[tuple[str, str, str]]) -> list[list[str]]:
    """Group ``keys`` by longest-path depth from the sources; order each layer.

    Within a layer, nodes are sorted by the mean position of their parents
    (one barycentre pass), which removes most crossings of small DAGs.
    """
    parents: dict[str, list[str]] = {k: [] for k in keys}
    for u, v, _ in edges:
        if u in parents and v in parents and u != v:
            parents[v].append(u)
    depth: dict[str, int] = {}
    for key in keys:                       # iterative longest path, cycle-safe
        stack = [key]
        while stack:
            k = stack[-1]
            if k in depth:
                stack.pop()
                continue
            todo = [p for p in parents[k] if p not in depth and p not in stack]
            if todo:
                stack.extend(todo)
                continue
            depth[k] = 1 + max((depth.get(p, -1) for p in parents[k]), default=-1)
            stack.pop()
    out: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for key in keys:
        out[depth[key]].append(key)
    pos: dict[str, float] = {}
    for layer in out:
        if pos:
            first = {k: i for i, k in enumerate(layer)}
            layer.sort(key=lambda k: (sum(pos.get(p, 0.0) for p in parents[k])
                                      / len(parents[k]) if parents[k] else first[k], first[k]))
        for i, k in enumerate(layer):
            pos[k] = i - (len(layer) - 1) / 2
    return out


def svg_graph(nodes: Sequence[tuple[str, str, bool]], edges: Sequence[tuple[str, str, str]],
              states: Mapping[str, str]) -> str:
    """Lay out ``(key, label, is_map)`` nodes and ``(up, down, kind)`` edges as SVG."""
    if not nodes:
        return "<svg width='0' height='0'></svg>"
    labels = {k: label for k, label, _ in nodes}
    maps = {k for k, _, m in nodes if m}
    rows = layers([k for k, _, _ in nodes], edges)
    char_w, box_h, gap_x, gap_y, pad = 7.2, 24.0, 18.0, 36.0, 10.0
    width_of = {k: max(48.0, len(labels[k]) * char_w + 16) for k in labels}
    row_w = [sum(width_of[k] for k in row) + gap_x * (len(row) - 1) for row in rows]
    total_w = max(row_w) + 2 * pad + 6
    total_h = len(rows) * (box_h + gap_y) - gap_y + 2 * pad + 6
    xy: dict[str, tuple[float, float]] = {}
    for r, row in enumerate(rows):
        x = pad + (total_w - 2 * pad - row_w[r]) / 2
        y = pad + r * (box_h + gap_y)
        for k in row:
            xy[k] = (x, y)
            x += width_of[k] + gap_x
    uid = "lf" + hashlib.blake2b(repr((nodes, edges)).encode(), digest_size=4).hexdigest()
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
             f'height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}" '
             f'style="{_FONT}">',
             f'<defs><marker id="{uid}a" viewBox="0 0 10 10" refX="10" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>']
    dash = {"after": ' stroke-dasharray="4 3"', "map": "", "data": ""}
    for u, v, kind in edges:
        if u not in xy or v not in xy:
            continue
        (ux, uy), (vx, vy) = xy[u], xy[v]
        x1, y1 = ux + width_of[u] / 2, uy + box_h
        x2, y2 = vx + width_of[v] / 2, vy
        if y2 <= y1:        # same layer or upward (only in invalid graphs): go around
            y2 = vy + box_h
        mid = (y1 + y2) / 2
        sw = "2.2" if kind == "map" else "1.2"
        parts.append(f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} '
                     f'{x2:.1f},{y2:.1f}" fill="none" stroke="#555" stroke-width="{sw}"'
                     f'{dash.get(kind, "")} marker-end="url(#{uid}a)"/>')
    for k, label, _ in nodes:
        x, y = xy[k]
        w = width_of[k]
        state = states.get(k)
        fill = STATE_COLOURS.get(state, _DEFAULT_COLOUR) if state else "#ffffff"
        tip = _e(k + (f": {state}" if state else ""))
        parts.append(f"<g><title>{tip}</title>")
        if k in maps:
            parts.append(f'<rect x="{x + 4:.1f}" y="{y - 4:.1f}" width="{w:.1f}" '
                         f'height="{box_h}" rx="4" fill="{fill}" stroke="#888"/>')
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{box_h}" rx="4" '
                     f'fill="{fill}" stroke="#444"/>')
        parts.append(f'<text x="{x + w / 2:.1f}" y="{y + box_h / 2 + 4:.1f}" '
                     f'text-anchor="middle" fill="#111">{_e(label)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


# -- live progress -----------------------------------------------------------------------

_TERMINAL = frozenset(s.value for s in TERMINAL)


class NotebookProgress:
    """A live one-line progress display for a run in Jupyter.

    Pass an instance as the ``progress=`` callback of
    :func:`ledgerflow.run` or :func:`ledgerflow.resume`. It is called on
    the driver thread for every transition and redraws at most every
    ``interval`` seconds (a trailing redraw shows the final counts). Outside
    IPython it does nothing; it needs no ipywidgets.

    Example:
        >>> p = NotebookProgress()      # outside IPython: a silent no-op
        >>> p("a", "", "pending"); p("a", "pending", "succeeded")
        >>> p.counts()["done"]
        1
    """

    def __init__(self, label: str = "", *, interval: float = 0.2,
                 display: bool | None = None) -> None:
        self.label = label
        self.interval = interval
        self.states: dict[str, str] = {}
        self._lock = threading.Lock()
        self._last = 0.0
        self._timer: threading.Timer | None = None
        self._handle: Any = None
        self.started = time.monotonic()
        if display is None:
            display = _in_ipython()
        if display:
            try:
                from IPython.display import HTML
                from IPython.display import display as ipy_display
                self._HTML = HTML
                self._handle = ipy_display(HTML(self.html()),  # type: ignore[no-untyped-call]
                                           display_id=True)
            except Exception:       # pragma: no cover - broken IPython install
                self._handle = None

    def __call__(self, task_key: str, old_state: str | None, new_state: str) -> None:
        with self._lock:
            self.states[task_key] = new_state
            if self._handle is None:
                return
            now = time.monotonic()
            final = bool(self.states) and all(s in _TERMINAL for s in self.states.values())
            if final or now - self._last >= self.interval:
                self._last = now
                self._cancel_timer()
                draw = True
            else:
                draw = False
                if self._timer is None:
                    self._timer = threading.Timer(self.interval - (now - self._last),
                                                  self._flush)
                    self._timer.daemon = True
                    self._timer.start()
        if draw:
            self._draw()

    def counts(self) -> dict[str, int]:
        """``total``, ``done``, ``running``, ``failed``, ``waiting``, ``cancelled`` counts."""
        c = {"total": len(self.states), "done": 0, "running": 0, "failed": 0, "cancelled": 0,
             "waiting": 0}
        for s in self.states.values():
            if s == _T.SUCCEEDED:
                c["done"] += 1
            elif s in IN_FLIGHT:
                c["running"] += 1
            elif s in (_T.FAILED, _T.UPSTREAM_FAILED):
                c["failed"] += 1
            elif s == _T.CANCELLED:
                c["cancelled"] += 1
            else:
                c["waiting"] += 1
        return c

    def text(self) -> str:
        """The progress line as plain text."""
        c = self.counts()
        secs = time.monotonic() - self.started
        head = f"{self.label}: " if self.label else ""
        return (f"{head}{c['done']}/{c['total']} done, {c['running']} running, "
                f"{c['failed']} failed" + (f", {c['cancelled']} cancelled" if c["cancelled"]
                                           else "") + f" ({secs:.1f} s)")

    def html(self) -> str:
        """The progress line as HTML: a bar plus the counts."""
        c = self.counts()
        total = max(c["total"], 1)
        bar = "".join(
            f'<div style="width:{100 * n / total:.1f}%;background:{colour}"></div>'
            for n, colour in ((c["done"], STATE_COLOURS[_T.SUCCEEDED]),
                              (c["failed"], STATE_COLOURS[_T.FAILED]),
                              (c["running"], STATE_COLOURS[_T.RUNNING])) if n)
        return (f'<div style="{_FONT}"><div style="display:flex;width:240px;height:8px;'
                f'background:#eee;border-radius:4px;overflow:hidden">{bar}</div>'
                f"{_e(self.text())}</div>")

    def close(self) -> None:
        """Draw the final state now and stop the trailing timer."""
        with self._lock:
            self._cancel_timer()
        self._draw()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            self._last = time.monotonic()
        self._draw()

    def _draw(self) -> None:
        handle = self._handle
        if handle is None:
            return
        with self._lock:
            body = self.html()
        try:
            handle.update(self._HTML(body))  # type: ignore[no-untyped-call]
        except Exception:          # a display problem must never break a run
            self._handle = None


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None
