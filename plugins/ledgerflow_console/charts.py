"""The run page's drawings: the timeline of every attempt and the task graph, as inline SVG.

The timeline draws one lane per task and one bar per attempt (at least
:data:`MIN_BAR_W` pixels wide), or, above the lane limit, one lane per task
name with attempts counted into time slices (:func:`ledgerflow_console.views.timeline`
decides which); the graph is drawn in layers by depth, fan-outs folded
into one node (:func:`ledgerflow_console.graphs.graph`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlencode

from ledgerflow.display import layers

from .markup import COLOURS, OUTCOME_COLOURS, e, fmt_ms, fmt_tick, inspect_url, run_path
from .views import TIMES, ordered_counts

#: The order in which an aggregated cell picks its colour (the worst outcome wins).
_OUTCOME_RANK: Final = ("error", "timeout", "lost", "cancelled", "waiting", "running", "ok")

LABEL_W: Final = 260
PLOT_W: Final = 1000
ROW_H: Final = 18
BAR_H: Final = 12
AXIS_H: Final = 24
#: Narrowest bar drawn, in pixels: a 30 µs attempt stays visible.
MIN_BAR_W: Final = 2.0


def _nice_step(span_ms: float, ticks: int = 8) -> float:
    raw = max(span_ms / ticks, 1e-3)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return float(m * mag)
    return float(10 * mag)


def _worst_outcome(outcomes: Mapping[str, int]) -> str:
    for o in _OUTCOME_RANK:
        if outcomes.get(o):
            return o
    return next(iter(outcomes), "ok")


def _short(text: str, n: int = 34) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def timeline_html(rid: str, tl: Mapping[str, Any]) -> str:
    """Every attempt as a bar on one time axis; retries, waits and outcomes in colour."""
    if not tl["attempts_total"] and not tl["lanes"]:
        return '<h2>Timeline</h2><div id="timeline" class="muted">no attempt yet</div>'
    span = max(float(tl["span_ms"]), 1.0)
    scale = PLOT_W / span
    lanes = tl["lanes"]
    groups = tl["groups"]
    n_rows = len(groups) + len(lanes) + (1 if groups and lanes else 0)
    height = AXIS_H + n_rows * ROW_H + 4
    width = LABEL_W + PLOT_W + 12
    out = [f'<svg id="timeline-svg" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" font-family="ui-monospace,monospace" font-size="11">']
    step = _nice_step(span)
    t = 0.0
    while t <= span + 1e-9:
        x = LABEL_W + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height}" '
                   'stroke="#e5e7eb"/>'
                   f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="middle" fill="#6b7280">'
                   f"+{e(fmt_tick(t))}</text>")
        t += step
    y = AXIS_H
    for g in groups:
        peak = max((c["n"] for c in g["buckets"]), default=1)
        label = f"{g['task']} {TIMES}{g['tasks']:,}"
        out.append(f'<g class="group" data-task="{e(g["task"])}"><text x="4" y="{y + 12}">'
                   f"<title>{e(label)}: {g['attempts']:,} attempts, "
                   + e(", ".join(f"{n:,} {o}" for o, n in g["outcomes"].items()))
                   + f"</title>{e(_short(label))}</text>")
        for c in g["buckets"]:
            x = LABEL_W + c["start_ms"] * scale
            w = max(MIN_BAR_W, (c["end_ms"] - c["start_ms"]) * scale)
            h = max(2.0, BAR_H * c["n"] / peak)
            oc = _worst_outcome(c["outcomes"])
            out.append(f'<rect class="cell" x="{x:.1f}" y="{y + 3 + BAR_H - h:.1f}" '
                       f'width="{w:.1f}" height="{h:.1f}" fill="{OUTCOME_COLOURS.get(oc, "#999")}">'
                       f"<title>{e(g['task'])}: {c['n']:,} attempts between "
                       f"+{e(fmt_ms(c['start_ms']))} and +{e(fmt_ms(c['end_ms']))}: "
                       + e(", ".join(f"{n:,} {o}" for o, n in c["outcomes"].items()))
                       + "</title></rect>")
        out.append("</g>")
        y += ROW_H
    if groups and lanes:
        out.append(f'<text x="4" y="{y + 12}" fill="#6b7280">retried, failed or running '
                   f'({len(lanes)} of {tl.get("notable_total", len(lanes))}):</text>')
        y += ROW_H
    for lane in lanes:
        key = lane["task_key"]
        out.append(f'<g class="lane" data-task="{e(key)}">'
                   f'<text x="4" y="{y + 12}"><title>{e(key)}</title>{e(_short(key))}</text>')
        mid = y + 3 + BAR_H / 2
        for wt in lane["waits"]:
            x1 = LABEL_W + wt["start_ms"] * scale
            x2 = LABEL_W + wt["end_ms"] * scale
            out.append(f'<line class="wait" x1="{x1:.1f}" y1="{mid:.1f}" x2="{max(x2, x1 + 1):.1f}" '
                       f'y2="{mid:.1f}" stroke="#eab308" stroke-width="2" stroke-dasharray="3 2">'
                       f"<title>{e(key)}: {e(wt['kind'])} "
                       f"{e(fmt_ms(wt['end_ms'] - wt['start_ms']))}</title></line>")
        bars = list(lane["bars"]) + ([lane["running"]] if lane["running"] else [])
        for b in bars:
            x = LABEL_W + b["start_ms"] * scale
            w = max(MIN_BAR_W, (b["end_ms"] - b["start_ms"]) * scale)
            oc = b["outcome"] or "ok"
            running = oc == "running"
            dur = b["end_ms"] - b["start_ms"]
            tip = (f"{key} attempt {b['attempt']}: {oc}"
                   + (f" for {fmt_ms(dur)} so far" if running else f", {fmt_ms(dur)}")
                   + f"\nstarted {b['started_at']}"
                   + ("" if running else f"\nended {b['ended_at']}")
                   + (f"\n{b['error']}" if b.get("error") else ""))
            url = inspect_url(rid, key, b["attempt"])
            cls = "attempt running" if running else "attempt"
            out.append(f'<rect class="{cls}" data-task="{e(key)}" data-attempt="{b["attempt"]}" '
                       f'data-outcome="{e(oc)}" data-load="{e(url)}" data-into="#inspector" '
                       f'data-scroll="1" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" '
                       f'height="{BAR_H}" rx="2" fill="{OUTCOME_COLOURS.get(oc, "#999")}">'
                       f"<title>{e(tip)}</title></rect>")
        out.append("</g>")
        y += ROW_H
    out.append("</svg>")
    legend = ('<div class="legend">' + "".join(
        f'<span><i style="background:{c}"></i>{e(o)}</span>'
        for o, c in OUTCOME_COLOURS.items())
        + '<span><i style="background:repeating-linear-gradient(90deg,#eab308 0 3px,'
          'transparent 3px 5px);height:3px"></i>wait before a retry</span></div>')
    note = (f"{tl['attempts_total']:,} attempts of {tl['lanes_total']:,} tasks from "
            f"{e(tl['t0_iso'])} over {e(fmt_ms(tl['span_ms']))}")
    if tl["aggregated"]:
        note += (f"; aggregated by task name in slices of {e(fmt_ms(tl['bucket_ms']))} "
                 "(bar height: attempts in the slice, colour: the worst outcome)")
    return (f'<h2>Timeline</h2><div class="muted">{note}</div>{legend}'
            f'<div id="timeline" class="scroll" data-aggregated="{int(tl["aggregated"])}">'
            + "".join(out) + "</div>")


# -- graph -------------------------------------------------------------------------------

#: The graph's widest row of nodes, in pixels: a wider layer wraps onto more rows.
GRAPH_W: Final = 1200
NODE_H: Final = 26
STATE_BAR_H: Final = 6
GAP_X: Final = 14
GAP_Y: Final = 34
LAYER_GAP: Final = 12
CHAR_W: Final = 7.0


def _node_w(label: str) -> float:
    return max(56.0, len(_short(label, 40)) * CHAR_W + 16)


def _wrap(layer: list[str], width: Mapping[str, float]) -> list[list[str]]:
    rows: list[list[str]] = [[]]
    used = 0.0
    for k in layer:
        w = width[k] + GAP_X
        if rows[-1] and used + w > GRAPH_W:
            rows.append([])
            used = 0.0
        rows[-1].append(k)
        used += w
    return rows


def graph_svg(model: Mapping[str, Any], rid: str | None = None) -> str:
    """The task graph in layers by depth (sources on top), as inline SVG.

    A fan-out (or, on a large run, every task of one name) is one node with
    its count and a bar of its tasks' states; a layer wider than
    :data:`GRAPH_W` wraps, so the drawing stays as wide as the page.
    """
    nodes = {n["key"]: n for n in model["nodes"]}
    if not nodes:
        return '<span class="muted">no tasks yet</span>'
    edges = [(x["from"], x["to"], "data") for x in model["edges"]
             if x["from"] in nodes and x["to"] in nodes]
    width = {k: _node_w(n["label"]) for k, n in nodes.items()}
    xy: dict[str, tuple[float, float]] = {}
    y = 8.0
    total_w = 0.0
    depth_of: dict[str, int] = {}
    for d, layer in enumerate(layers(list(nodes), edges)):
        for row in _wrap(layer, width):
            x = 8.0
            for k in row:
                xy[k] = (x, y)
                depth_of[k] = d
                x += width[k] + GAP_X
            total_w = max(total_w, x)
            y += NODE_H + STATE_BAR_H + GAP_Y
        y += LAYER_GAP
    height = y - GAP_Y - LAYER_GAP + 8
    out = [f'<svg id="graph-svg" xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {total_w:.0f} {height:.0f}" '
           'font-family="ui-monospace,monospace" font-size="11">'
           '<defs><marker id="lfarrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
           'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#9ca3af"/>'
           "</marker></defs>"]
    for u, v, _ in edges:
        (x1, y1), (x2, y2) = xy[u], xy[v]
        ax, ay = x1 + width[u] / 2, y1 + NODE_H + STATE_BAR_H
        bx, by = x2 + width[v] / 2, y2
        mid = (ay + by) / 2
        out.append(f'<path class="edge" data-from="{e(u)}" data-to="{e(v)}" fill="none" '
                   f'stroke="#9ca3af" marker-end="url(#lfarrow)" d="M{ax:.1f},{ay:.1f} '
                   f'C{ax:.1f},{mid:.1f} {bx:.1f},{mid:.1f} {bx:.1f},{by:.1f}"/>')
    for k, n in nodes.items():
        x, y0 = xy[k]
        w = width[k]
        counts = n.get("counts") or {n["state"]: 1}
        tip = n["label"] + "\n" + ", ".join(f"{c:,} {s}" for s, c in ordered_counts(counts))
        many = n["tasks"] > 1
        load = ""
        if rid is not None:
            url = (run_path(rid, "/items?" + urlencode({"task": n.get("task") or k})) if many
                   else inspect_url(rid, k))
            load = (f' data-load="{e(url)}" data-into="{"#items" if many else "#inspector"}"'
                    ' data-scroll="1" style="cursor:pointer"')
        out.append(f'<g class="node{" fan" if many else ""}" data-key="{e(k)}" '
                   f'data-state="{e(n["state"])}" data-tasks="{n["tasks"]}" '
                   f'data-depth="{depth_of[k]}"{load}><title>{e(tip)}</title>'
                   f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{NODE_H}" rx="4" '
                   f'fill="{COLOURS.get(n["state"], "#eee")}" stroke="#6b7280"/>'
                   f'<text x="{x + 8:.1f}" y="{y0 + 17:.1f}">{e(_short(n["label"], 40))}</text>')
        total = sum(counts.values()) or 1
        bx = x
        for st, c in ordered_counts(counts):
            bw = w * c / total
            out.append(f'<rect class="state-bar" data-state="{e(st)}" x="{bx:.1f}" '
                       f'y="{y0 + NODE_H + 1:.1f}" width="{max(bw, 1.0):.1f}" '
                       f'height="{STATE_BAR_H - 1}" fill="{COLOURS.get(st, "#999")}"/>')
            bx += bw
        out.append("</g>")
    out.append("</svg>")
    note = ('<div class="muted">one node per task name (count ' + TIMES
            + 'N; the bar under a node: its tasks by state)</div>' if model.get("collapsed")
            else '<div class="muted">in layers by depth; a fan-out of more than a few items '
            "is one node (count " + TIMES + "N, the bar: its items by state; click to list "
            "them)</div>")
    return "".join(out) + note
