"""The run page's drawings: the timeline of every attempt and the task graph, as inline SVG.

The timeline draws one lane per task and one bar per attempt (at least
:data:`MIN_BAR_W` pixels wide), or, above the lane limit, one lane per task
name with attempts counted into time slices (:func:`ledgerflow_console.views.timeline`
decides which); the graph is :func:`ledgerflow.display.svg_graph` of the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from ledgerflow.display import svg_graph

from .markup import OUTCOME_COLOURS, e, fmt_ms, fmt_tick, inspect_url
from .views import TIMES

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

def graph_svg(model: Mapping[str, Any]) -> str:
    """The task graph as inline SVG (ledgerflow's own layout)."""
    nodes = [(n["key"], n["label"], n["tasks"] > 1) for n in model["nodes"]]
    edges = [(x["from"], x["to"], "data") for x in model["edges"]]
    states = {n["key"]: n["state"] for n in model["nodes"]}
    if not nodes:
        return '<span class="muted">no tasks yet</span>'
    note = ('<div class="muted">one node per task name (stacked: several tasks; colour: the '
            "most urgent state among them)</div>" if model["collapsed"] else "")
    return note + svg_graph(nodes, edges, states)
