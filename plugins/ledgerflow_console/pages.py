"""HTML of the console's pages: the runs list and a run's page, drawn from :mod:`.views`.

The page frame and helpers are in :mod:`.markup`, the timeline and graph in
:mod:`.charts`, the panels (inspector, logs, lineage, approvals, usage,
notices) in :mod:`.panels`; their public names are re-exported here, where
the app finds every page and fragment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlencode

from . import views
from .charts import MIN_BAR_W, graph_svg, timeline_html
from .markup import (
    COLOURS,
    OUTCOME_COLOURS,
    Ctx,
    api_path,
    counts_html,
    e,
    error_page,
    fmt_ms,
    fmt_s,
    fmt_tick,
    href,
    inspect_link,
    layout,
    pill,
    run_path,
)
from .panels import (
    LOG_CHARS,
    approvals_html,
    inspector_html,
    lineage_html,
    logs_html,
    notices_html,
    usage_html,
)
from .views import TIMES

#: Characters of one parameter value shown before it is cut.
PARAM_CHARS: Final = 120


def _value(v: object) -> str:
    text = json.dumps(v, default=str, ensure_ascii=False)
    return text if len(text) <= PARAM_CHARS else text[:PARAM_CHARS - 1] + "…"


def params_text(params: Mapping[str, Any]) -> str:
    """Parameters on one line as ``-p`` writes them: ``n=5 label="x"``."""
    return " ".join(f"{k}={_value(v)}" for k, v in params.items())


def params_html(h: Mapping[str, Any]) -> str:
    """The run's target, trigger and parameters (a table: name, value)."""
    trig = views.trigger_text(h.get("trigger"))
    rows = "".join(f'<tr data-param="{e(k)}"><td class="mono">{e(k)}</td>'
                   f'<td class="mono">{e(_value(v))}</td></tr>'
                   for k, v in (h.get("params") or {}).items())
    return ('<div id="run-params" class="box">'
            + (f'<div>target <span class="mono">{e(h["target"])}</span></div>'
               if h.get("target") else "")
            + f'<div>trigger <b class="trigger">{e(trig or "manual (no trigger recorded)")}</b></div>'
            + (f"<table><thead><tr><th>parameter</th><th>value</th></tr></thead>"
               f"<tbody>{rows}</tbody></table>" if rows
               else '<div class="muted">no parameters (the defaults)</div>')
            + "</div>")

__all__ = ["COLOURS", "LOG_CHARS", "MIN_BAR_W", "OUTCOME_COLOURS", "Ctx", "api_path",
           "approvals_html", "counts_html", "error_page", "fmt_ms", "fmt_s", "fmt_tick",
           "graph_svg", "groups_html", "href", "inspector_html", "items_html", "layout",
           "lineage_html", "logs_html", "notices_html", "params_html", "params_text", "pill", "root_cause_html",
           "run_live", "run_page", "run_path", "runs_page", "runs_table", "timeline_html",
           "usage_html"]


# -- runs page ---------------------------------------------------------------------------

def _select(name: str, options: Sequence[str], chosen: str | None, label: str) -> str:
    opts = ['<option value="">all</option>'] + [
        f'<option value="{e(o)}"{" selected" if o == chosen else ""}>{e(o)}</option>'
        for o in options]
    return (f'<label>{e(label)} <select name="{e(name)}" onchange="this.form.submit()">'
            + "".join(opts) + "</select></label>")


def runs_page(ctx: Ctx, model: Mapping[str, Any], live_src: str) -> str:
    """The runs page: filters, then the live table of runs."""
    f = model["filter"]
    states = sorted(set(model["states"]) | {"running", "waiting", "succeeded", "failed",
                                            "cancelled"})
    hidden = f'<input type="hidden" name="token" value="{e(ctx.token)}">' if ctx.token else ""
    form = (f'<form class="filters" method="get" action="/">{hidden}'
            + _select("state", states, f["state"], "state")
            + _select("pipeline", model["pipelines"], f["pipeline"], "pipeline")
            + '<span class="muted">refreshes every few seconds</span></form>')
    return layout(ctx, "runs", "<h1>Runs</h1>" + form + start_form(ctx, model)
                  + runs_table(ctx, model, live_src))


def start_form(ctx: Ctx, model: Mapping[str, Any]) -> str:
    """Start a run of a pipeline already run here, with parameters (actions only)."""
    targets = model.get("targets") or []
    if not ctx.actions or not targets:
        return ""
    opts = "".join(f'<option value="{e(t)}">{e(t)}</option>' for t in targets)
    return ('<details id="start" class="box needs-token"><summary>Start a run</summary>'
            f'<label>pipeline <select name="target">{opts}</select></label> '
            '<label>parameters, one <span class="mono">name=value</span> a line (as '
            '<span class="mono">-p</span>)<br><textarea name="params" rows="3" cols="50">'
            "</textarea></label><br>"
            '<button data-action="/api/start" data-form="#start" '
            'data-confirm="Start a new run?">start</button></details>')


def runs_table(ctx: Ctx, model: Mapping[str, Any], live_src: str) -> str:
    """The table of runs (the part the runs page refreshes)."""
    cols = ["run", "pipeline", "state", "tasks by state", "started", "duration", "driver",
            "trigger", "parameters"]
    if ctx.has_approvals:
        cols.append("approvals")
    if ctx.has_usage:
        cols += ["tokens", "cost"]
    if ctx.actions:
        cols.append("")
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    rows = []
    for r in model["runs"]:
        rid = r["run_id"]
        driver = ""
        if r["state"] in ("running", "cancelling"):
            driver = ("alive" if r["driver_alive"] else
                      '<span title="resume it: its successes are kept">gone (resumable)</span>')
        cells = [f'<td class="mono"><a href="{e(href(ctx, run_path(rid)))}">{e(rid)}</a></td>',
                 f"<td>{e(r['pipeline'])}</td>", f"<td>{pill(r['state'])}</td>",
                 f"<td>{counts_html(r['counts'])}</td>",
                 f'<td class="mono">{e(r["created_at"])}</td>',
                 f'<td class="num">{e(fmt_s(r["duration_s"]))}</td>', f"<td>{driver}</td>",
                 f'<td class="trigger">{e(views.trigger_text(r.get("trigger")) or "manual")}</td>',
                 f'<td class="mono params">{e(params_text(r.get("params") or {}))}</td>']
        if ctx.has_approvals:
            n = r.get("pending_approvals")
            cells.append(f'<td class="num">{"" if not n else f"<b>{n}</b> pending"}</td>')
        if ctx.has_usage:
            u = r.get("usage") or {}
            cells.append(f'<td class="num">{int(u["tokens"]):,}</td>' if u.get("tokens")
                         else "<td></td>")
            cells.append(f'<td class="num">{u["cost"]:.4f}</td>' if u.get("cost")
                         else "<td></td>")
        if ctx.actions:
            cells.append(f"<td>{_run_buttons(rid, r['state'], r['driver_alive'])}</td>")
        rows.append(f'<tr data-run="{e(rid)}" data-state="{e(r["state"])}">'
                    + "".join(cells) + "</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(cols)}" class="muted">no runs'
                    + (" match the filter" if model["total"] else " yet") + "</td></tr>")
    return (f'<div id="live" data-active="1" data-src="{e(live_src)}">'
            f'<table id="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
            f'</table><p class="muted">{len(model["runs"])} of {model["total"]} runs shown</p>'
            "</div>")


def _run_buttons(run_id: str, state: str, driver_alive: bool | None) -> str:
    out = []
    if state in ("running", "cancelling", "waiting"):
        out.append(f'<button class="danger needs-token" '
                   f'data-action="{e(api_path(run_id, "/cancel"))}" '
                   f'data-confirm="Cancel run {e(run_id)}?">cancel</button>')
    if state != "succeeded" and not driver_alive:
        out.append(f'<button class="needs-token" data-action="{e(api_path(run_id, "/resume"))}" '
                   f'data-confirm="Resume run {e(run_id)} in a new process?">resume</button>')
    return " ".join(out)


# -- run page ----------------------------------------------------------------------------

def run_page(ctx: Ctx, model: Mapping[str, Any], live_src: str) -> str:
    """The run page: the live part, then the panels loaded on demand."""
    rid = model["header"]["run_id"]
    graph = (f'<h2>Graph</h2><div id="graph" class="box scroll" '
             f'data-autoload="{e(run_path(rid, "/graph.svg"))}">'
             '<span class="muted">loading…</span></div>')
    inspector = ('<h2>Selected task</h2><div id="inspector" class="box">'
                 '<span class="muted">click a bar of the timeline or a task to see its '
                 "attempts, logs and lineage</span></div>")
    usage = ""
    if ctx.has_usage and model.get("has_calls", True):
        usage = (f'<h2>Model and tool calls</h2><div id="usage" class="box scroll" '
                 f'data-autoload="{e(run_path(rid, "/usage"))}"></div>')
    notices = notices_html(model.get("notices") or [])
    body = (f'<p><a href="{e(href(ctx, "/"))}">← all runs</a></p>'
            + run_live(ctx, model, live_src)
            + '<div id="items"></div>' + inspector + graph + usage + notices)
    return layout(ctx, f"run {rid}", body)


def run_live(ctx: Ctx, model: Mapping[str, Any], live_src: str) -> str:
    """Header, counts, root cause, approvals, tasks by name and timeline (refreshed)."""
    h = model["header"]
    rid = h["run_id"]
    driver = ""
    if h["state"] in ("running", "cancelling"):
        driver = (" · driver alive" if h["driver_alive"]
                  else " · <b>driver gone</b>: resume to finish it")
    buttons = _run_buttons(rid, h["state"], h["driver_alive"]) if ctx.actions else ""
    head = (f'<h1>run <span class="mono">{e(rid)}</span> of <b>{e(h["pipeline"])}</b> '
            f'{pill(h["state"])} {buttons}</h1>'
            + (f'<div class="muted">reason: {e(h["reason"])}</div>' if h["reason"] else "")
            + f'<div class="muted mono">started {e(h["created_at"])}'
            + (f" · ended {e(h['ended_at'])}" if h["ended_at"] and not h["active"] else "")
            + f" · {e(fmt_s(h['duration_s']))}{driver}</div>"
            + f'<div id="counts" class="box">{h["total"]:,} tasks: '
            + counts_html(h["counts"]) + "</div>")
    parts = [head, params_html(h), root_cause_html(ctx, rid, model["root_cause"])]
    if ctx.has_approvals and model.get("approvals") is not None:
        parts.append(approvals_html(ctx, rid, model["approvals"]))
    parts.append(groups_html(rid, model["groups"]))
    parts.append(timeline_html(rid, model["timeline"]))
    return (f'<div id="live" data-active="{1 if h["active"] else 0}" '
            f'data-version="{e(_version(h))}" data-src="{e(live_src)}">' + "".join(parts)
            + "</div>")


def _version(h: Mapping[str, Any]) -> str:
    """Changes whenever the run's state or its counts change (panels reload then)."""
    return str(h["state"]) + ":" + ",".join(f"{s}={n}" for s, n in sorted(h["counts"].items()))


def root_cause_html(ctx: Ctx, rid: str, rc: Mapping[str, Any]) -> str:
    """The tasks that failed by themselves, and how many failed because of them."""
    if not rc["failed_total"] and not rc["upstream_failed_total"]:
        return ""
    rows = "".join(
        f"<tr><td>{inspect_link(rid, f['key'])}</td><td class=num>{f['attempts']}</td>"
        f'<td class="mono">{e(f["error"])}</td></tr>' for f in rc["failed"])
    more = rc["failed_total"] - len(rc["failed"])
    down = ", ".join(f"{e(k)} {TIMES}{n:,}" for k, n in rc["upstream_failed_by_task"].items())
    first = rc["failed"][0]["key"] if rc["failed"] else None
    n_up = int(rc["upstream_failed_total"])
    return ('<div id="root-cause" class="box bad"><b>Root cause</b>: '
            + (f'<span class="mono">{e(first)}</span> failed by itself' if first
               else "no task failed by itself")
            + (f" ({rc['failed_total']} failed in all)" if rc["failed_total"] > 1 else "")
            + (f"; <b>{n_up:,}</b> downstream task{'' if n_up == 1 else 's'} "
               f"{'is' if n_up == 1 else 'are'} <i>upstream_failed</i> because of it: {down}"
               if n_up else "")
            + (f'<table><thead><tr><th>task</th><th class=num>attempts</th><th>error</th>'
               f'</tr></thead><tbody>{rows}</tbody></table>' if rows else "")
            + (f'<div class="muted">and {more} more</div>' if more > 0 else "") + "</div>")


def groups_html(rid: str, groups: Sequence[Mapping[str, Any]]) -> str:
    """Tasks by name: ``embed x 960: 955 succeeded, 5 cached``, each expandable."""
    rows = []
    for g in groups:
        err = g["first_error"]
        items = run_path(rid, "/items?" + urlencode({"task": g["task"]}))
        rows.append(
            f'<tr data-task="{e(g["task"])}"><td><b>{e(g["task"])}</b>'
            + (f' <span class="muted">{TIMES} {g["tasks"]:,}</span>' if g["tasks"] > 1
               else "")
            + f'</td><td>{counts_html(g["counts"])}'
            + (f' <span class="muted">({g["cached"]:,} cached)</span>' if g["cached"] else "")
            + f'</td><td class="num">{g["attempts"]:,}</td>'
            f'<td class="num">{g["retried"]:,}</td>'
            f'<td class="num">{e(fmt_ms(g["median_ms"]))}</td>'
            f'<td class="num">{e(fmt_ms(g["max_ms"]))}</td>'
            f'<td class="num">{e(fmt_ms(g["busy_ms"]))}</td>'
            f'<td class="mono">{e(err["key"] + ": " + err["error"]) if err else ""}</td>'
            f'<td><button data-load="{e(items)}" data-into="#items" data-scroll="1">'
            f'{"items" if g["tasks"] > 1 else "details"}</button></td></tr>')
    head = "".join(f"<th{' class=num' if c in _NUM else ''}>{c}</th>" for c in (
        "task", "states", "attempts", "retried", "median", "max", "busy", "first error", ""))
    return (f'<h2>Tasks by name</h2><table id="groups"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


_NUM: Final = frozenset({"attempts", "retried", "median", "max", "busy"})


def items_html(ctx: Ctx, rid: str, model: Mapping[str, Any]) -> str:
    """One page of a task name's items, with paging and a state filter."""
    task, state = model["task"], model["state"]
    total, off, lim = model["total"], model["offset"], model["limit"]

    def url(offset: int, st: str | None) -> str:
        q: dict[str, object] = {"offset": offset, "limit": lim}
        if task is not None:
            q["task"] = task
        if st:
            q["state"] = st
        return run_path(rid, "/items?" + urlencode(q))

    def nav(label: str, offset: int, enabled: bool) -> str:
        dis = "" if enabled else " disabled"
        return (f'<button data-load="{e(url(offset, state))}" data-into="#items"{dis}>'
                f"{label}</button>")

    rows = "".join(
        f'<tr data-key="{e(t["key"])}" data-state="{e(t["state"])}">'
        f'<td>{inspect_link(rid, t["key"])}</td><td>{pill(t["state"])}'
        + (' <span class="muted">cached</span>' if t["cached"] else "")
        + f'</td><td class="num">{t["attempts"]}</td>'
        f'<td class="num">{e(fmt_ms(t["duration_ms"]))}</td>'
        f'<td class="mono">{e(t["started_at"])}</td><td class="mono">{e(t["error"])}</td></tr>'
        for t in model["tasks"])
    states = "".join(
        f'<button data-load="{e(url(0, s))}" data-into="#items"'
        f'{" disabled" if s == state else ""}>{e(s or "all")}</button> '
        for s in (None, "succeeded", "failed", "upstream_failed", "running", "cancelled"))
    shown = f"{off + 1:,}-{min(off + lim, total):,} of {total:,}" if total else "none"
    return (f'<h2>Items of <span class="mono">{e(task or "all tasks")}</span>'
            f'{" in state " + e(state) if state else ""}: {shown}</h2>'
            f'<div>{states} · {nav("← previous", max(0, off - lim), off > 0)} '
            f'{nav("next →", off + lim, off + lim < total)}</div>'
            '<table id="item-rows"><thead><tr><th>task key</th><th>state</th>'
            '<th class=num>attempts</th><th class=num>duration</th><th>started</th>'
            f"<th>error</th></tr></thead><tbody>{rows}</tbody></table>")
