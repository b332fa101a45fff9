"""HTML of the console's pages and fragments, drawn from the models in :mod:`.views`.

Plain HTML with inline CSS, one small inline script and inline SVG: no CDN,
no framework, nothing fetched from the internet. Every value that comes
from the ledger or from user code is escaped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Final
from urllib.parse import quote, urlencode

from ledgerflow.display import STATE_COLOURS, svg_graph

from .views import TIMES, iso, ordered_counts

#: Task and run state colours (the notebook's, plus the states of this stage).
COLOURS: Final[dict[str, str]] = {**STATE_COLOURS, "waiting_approval": "#fef08a",
                                  "waiting": "#fef08a"}
#: Attempt outcome colours on the timeline.
OUTCOME_COLOURS: Final[dict[str, str]] = {
    "ok": "#22c55e", "error": "#ef4444", "timeout": "#f97316", "cancelled": "#a8a29e",
    "lost": "#a855f7", "waiting": "#eab308", "running": "#3b82f6"}
#: The order in which an aggregated cell picks its colour (the worst outcome wins).
_OUTCOME_RANK: Final = ("error", "timeout", "lost", "cancelled", "waiting", "running", "ok")

LABEL_W: Final = 260
PLOT_W: Final = 1000
ROW_H: Final = 18
BAR_H: Final = 12
AXIS_H: Final = 24
#: Narrowest bar drawn, in pixels: a 30 µs attempt stays visible.
MIN_BAR_W: Final = 2.0
#: Characters of log text shown per attempt before the page says what it cut.
LOG_CHARS: Final = 200_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Ctx:
    """What every page needs to know about the console serving it."""

    store: str
    actions: bool
    token: str | None = None    # set when this request carried the right token
    has_logs: bool = False
    has_approvals: bool = False
    has_usage: bool = False


def e(value: object) -> str:
    """Escape text for HTML content and attribute values."""
    return escape("" if value is None else str(value), quote=True)


def href(ctx: Ctx, path: str, **query: object) -> str:
    """A link within the console, carrying the token when this page has it."""
    q = {k: v for k, v in query.items() if v is not None and v != ""}
    if ctx.token:
        q["token"] = ctx.token
    return path + ("?" + urlencode(q) if q else "")


def run_path(run_id: str, tail: str = "") -> str:
    """The path of a run's page (or of one of its fragments)."""
    return f"/runs/{quote(run_id, safe='')}{tail}"


def api_path(run_id: str, tail: str = "") -> str:
    """The path of a run's JSON endpoint."""
    return f"/api/runs/{quote(run_id, safe='')}{tail}"


def pill(state: str | None) -> str:
    """A state name on its colour."""
    s = state or "?"
    return (f'<span class="pill" data-state="{e(s)}" '
            f'style="background:{COLOURS.get(s, "#f3f4f6")}">{e(s)}</span>')


def counts_html(counts: Mapping[str, int]) -> str:
    """Counts by state as pills: ``succeeded 95  failed 5``."""
    return " ".join(f'<span class="count" data-state="{e(s)}">{pill(s)}&nbsp;'
                    f'<b>{n:,}</b></span>' for s, n in ordered_counts(counts)) or "no tasks"


def fmt_ms(ms: float | None) -> str:
    """A duration with millisecond precision: ``0.028 ms``, ``12.345 ms``, ``1.234 s``."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.3f} ms"
    if ms < 120_000:
        return f"{ms / 1000:.3f} s"
    return f"{int(ms // 60_000)} min {ms % 60_000 / 1000:.3f} s"


def fmt_tick(ms: float) -> str:
    """An axis label: as short as the tick step allows (``500 ms``, ``1.5 s``)."""
    def trim(x: float) -> str:
        return f"{x:.3f}".rstrip("0").rstrip(".")
    return f"{trim(ms)} ms" if ms < 1000 else f"{trim(ms / 1000)} s"


def fmt_s(s: float | None) -> str:
    """A duration given in seconds, shown as :func:`fmt_ms` does."""
    return "" if s is None else fmt_ms(s * 1000)


_CSS: Final = """
[hidden]{display:none!important}
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#111;
 background:#fafafa}
header{background:#111827;color:#f9fafb;padding:8px 16px;display:flex;gap:16px;
 align-items:baseline}
header a{color:#f9fafb;text-decoration:none;font-weight:600}
header .where{color:#9ca3af;font-size:12px;font-family:ui-monospace,monospace}
main{padding:12px 16px}
h1{font-size:18px;margin:8px 0} h2{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #e5e7eb;vertical-align:top}
th{background:#f3f4f6;font-weight:600;font-size:12px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.mono,code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre{background:#0b1020;color:#e5e7eb;padding:8px;overflow:auto;max-height:420px;margin:4px 0}
pre.stderr{border-left:4px solid #ef4444}
.pill{border-radius:8px;padding:0 7px;color:#111;white-space:nowrap}
.count{margin-right:10px;white-space:nowrap}
.box{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:8px 12px;margin:8px 0}
.bad{border-color:#fca5a5;background:#fef2f2}
.msg{padding:6px 10px;border-radius:4px;margin:6px 0;display:inline-block}
.msg.ok{background:#dcfce7}.msg.bad{background:#fee2e2}
.muted{color:#6b7280}
button{font:inherit;font-size:12px;padding:2px 8px;cursor:pointer}
button.danger{color:#b91c1c}
form.filters{display:flex;gap:12px;align-items:center;margin:6px 0}
.scroll{overflow-x:auto;max-width:100%}
svg .attempt{cursor:pointer}
svg .attempt:hover{stroke:#111;stroke-width:1}
svg .running{animation:pulse 1.2s ease-in-out infinite}
@keyframes pulse{50%{opacity:.45}}
.legend span{margin-right:12px;white-space:nowrap}
.legend i{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:middle}
"""

_JS: Final = """
(function(){
const TOKEN = new URLSearchParams(location.search).get('token') || '';
async function load(el, url){
  const r = await fetch(url, {headers:{'Accept':'text/html'}});
  el.innerHTML = await r.text();
  el.querySelectorAll('[data-autoload]').forEach(x => load(x, x.dataset.autoload));
}
function say(ok, text){
  const m = document.getElementById('message'); if(!m) return;
  m.textContent = text; m.className = 'msg ' + (ok ? 'ok' : 'bad'); m.hidden = false;
}
async function act(b){
  if (b.dataset.confirm && !confirm(b.dataset.confirm)) return;
  const body = {};
  if (b.dataset.task) body.task_key = b.dataset.task;
  if (b.dataset.digest) body.digest = b.dataset.digest;
  if (b.dataset.ask){ const r = prompt(b.dataset.ask, ''); if (r === null) return; body.reason = r; }
  const r = await fetch(b.dataset.action, {method:'POST', body: JSON.stringify(body),
    headers:{'Content-Type':'application/json','X-Ledgerflow-Token':TOKEN}});
  let doc = {}; try { doc = await r.json(); } catch(_) {}
  say(r.ok, r.ok ? (doc.message || 'done')
               : 'Error: ' + (doc.error || r.status) + (doc.hint ? '  Hint: ' + doc.hint : ''));
  follow = Date.now() + 15000;   // keep refreshing while the action takes effect
  setTimeout(refresh, 300);
}
document.addEventListener('click', async ev => {
  const a = ev.target.closest('[data-action]');
  if (a){ ev.preventDefault(); await act(a); return; }
  const l = ev.target.closest('[data-load]');
  if (l){
    ev.preventDefault();
    const into = document.querySelector(l.dataset.into);
    if (!into) return;
    into.innerHTML = '<span class="muted">loading…</span>';
    await load(into, l.dataset.load);
    if (l.dataset.scroll) into.scrollIntoView({block:'nearest'});
  }
});
let busy = false, wait = 2000, follow = 0;
async function refresh(){
  const live = document.getElementById('live');
  if (!live || busy) return;
  busy = true; const t = performance.now();
  try {
    const r = await fetch(live.dataset.src, {headers:{'Accept':'text/html'}});
    if (r.ok){
      const before = live.dataset.version;
      live.outerHTML = await r.text();
      const after = document.getElementById('live');
      if (after && after.dataset.version !== before)   // the graph and panels follow the run
        document.querySelectorAll('[data-autoload]').forEach(el => load(el, el.dataset.autoload));
    }
  } catch(_) {} finally { busy = false; }
  wait = Math.max(2000, 4 * (performance.now() - t));
}
async function loop(){
  const live = document.getElementById('live');
  if (live && (live.dataset.active === '1' || Date.now() < follow)) await refresh();
  setTimeout(loop, wait);
}
setTimeout(loop, wait);
document.querySelectorAll('[data-autoload]').forEach(el => load(el, el.dataset.autoload));
})();
"""


def layout(ctx: Ctx, title: str, body: str) -> str:
    """A whole page: header, the message line, ``body`` and the script."""
    mode = "actions enabled" if ctx.actions else "read-only"
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name=viewport content="width=device-width,initial-scale=1">'
            f"<title>{e(title)} · ledgerflow</title><style>{_CSS}</style></head><body>"
            f'<header><a href="{e(href(ctx, "/"))}">ledgerflow console</a>'
            f'<span class="where">{e(ctx.store)} · {mode}</span></header>'
            f'<main><div id="message" class="msg" hidden></div>{body}</main>'
            f"<script>{_JS}</script></body></html>")


def error_page(ctx: Ctx, status: int, error: str, hint: str | None) -> str:
    """What a page shows when its read failed: the Error and Hint lines."""
    body = (f'<h1>{status}</h1><div class="box bad"><b>Error:</b> {e(error)}'
            + (f"<br><b>Hint:</b> {e(hint)}" if hint else "") + "</div>"
            f'<p><a href="{e(href(ctx, "/"))}">all runs</a></p>')
    return layout(ctx, f"error {status}", body)


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
    return layout(ctx, "runs", "<h1>Runs</h1>" + form + runs_table(ctx, model, live_src))


def runs_table(ctx: Ctx, model: Mapping[str, Any], live_src: str) -> str:
    """The table of runs (the part the runs page refreshes)."""
    cols = ["run", "pipeline", "state", "tasks by state", "started", "duration", "driver"]
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
                 f'<td class="num">{e(fmt_s(r["duration_s"]))}</td>', f"<td>{driver}</td>"]
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
        out.append(f'<button class="danger" data-action="{e(api_path(run_id, "/cancel"))}" '
                   f'data-confirm="Cancel run {e(run_id)}?">cancel</button>')
    if state != "succeeded" and not driver_alive:
        out.append(f'<button data-action="{e(api_path(run_id, "/resume"))}" '
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
    if ctx.has_usage:
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
    parts = [head, root_cause_html(ctx, rid, model["root_cause"])]
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


def _inspect_url(rid: str, key: str, attempt: int | None = None) -> str:
    q: dict[str, object] = {"task": key}
    if attempt is not None:
        q["attempt"] = attempt
    return run_path(rid, "/inspect?" + urlencode(q))


def _inspect_link(rid: str, key: str, text: str | None = None) -> str:
    return (f'<a href="#inspector" class="mono" data-load="{e(_inspect_url(rid, key))}" '
            f'data-into="#inspector" data-scroll="1">{e(text or key)}</a>')


def root_cause_html(ctx: Ctx, rid: str, rc: Mapping[str, Any]) -> str:
    """The tasks that failed by themselves, and how many failed because of them."""
    if not rc["failed_total"] and not rc["upstream_failed_total"]:
        return ""
    rows = "".join(
        f"<tr><td>{_inspect_link(rid, f['key'])}</td><td class=num>{f['attempts']}</td>"
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
        f'<td>{_inspect_link(rid, t["key"])}</td><td>{pill(t["state"])}'
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


# -- timeline ----------------------------------------------------------------------------

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
            url = _inspect_url(rid, key, b["attempt"])
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


# -- inspector: one task's attempts, logs, lineage ---------------------------------------

def _table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str] | None = None,
           table_id: str = "") -> str:
    if not rows:
        return '<span class="muted">none</span>'
    if cols is None:
        cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{e(c)}</th>" for c in cols)

    def cell(v: object) -> str:
        if isinstance(v, dict | list):
            v = json.dumps(v, default=str)
        return f'<td class="mono">{e(v)}</td>'

    body = "".join("<tr>" + "".join(cell(r.get(c)) for c in cols) + "</tr>" for r in rows)
    ident = f' id="{e(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def logs_html(logs: Sequence[Mapping[str, Any]] | None, attempt: int | None) -> str:
    """Captured output, one block per attempt and stream, with what the cap dropped."""
    if logs is None:
        return ""
    if not logs:
        return ('<div id="logs" class="muted">no output captured'
                + (f" for attempt {attempt}" if attempt else "") + "</div>")
    blocks: dict[tuple[object, str], list[str]] = {}
    dropped: dict[tuple[object, str], int] = {}
    for rec in logs:
        k = (rec.get("attempt"), str(rec.get("stream") or "stdout"))
        blocks.setdefault(k, []).append(str(rec.get("text") or ""))
        dropped[k] = dropped.get(k, 0) + int(rec.get("dropped") or 0)
    out = ['<div id="logs">']
    for (att, stream), texts in blocks.items():
        text = "".join(texts)
        cut = ""
        if len(text) > LOG_CHARS:
            cut = f" (showing the last {LOG_CHARS:,} of {len(text):,} characters)"
            text = text[-LOG_CHARS:]
        drop = f"; {dropped[(att, stream)]:,} bytes dropped by the cap" \
            if dropped[(att, stream)] else ""
        out.append(f'<div class="log" data-attempt="{e(att)}" data-stream="{e(stream)}">'
                   f"<b>attempt {e(att)}</b> · {e(stream)}{e(drop)}{e(cut)}"
                   f'<pre class="{e(stream)}">{e(text)}</pre></div>')
    return "".join(out) + "</div>"


def inspector_html(ctx: Ctx, rid: str, key: str, attempt: int | None,
                   task: Mapping[str, Any] | None, attempts: Sequence[Mapping[str, Any]],
                   logs: Sequence[Mapping[str, Any]] | None) -> str:
    """The selected task: its row, every attempt, the chosen attempt's logs, its lineage.

    The lineage is a fragment of its own, loaded after the rest (on a large
    run it is the slowest read).
    """
    rows = []
    for a in attempts:
        dur = ((a["ended_at"] - a["started_at"]) * 1000
               if a.get("started_at") is not None and a.get("ended_at") is not None else None)
        err = " ".join(x for x in (a.get("error_type"), a.get("error_message")) if x)
        sel = ' class="selected" style="background:#eff6ff"' if a["attempt"] == attempt else ""
        link = (f'<a href="#inspector" data-load="{e(_inspect_url(rid, key, a["attempt"]))}" '
                f'data-into="#inspector">{a["attempt"]}</a>')
        rows.append(f'<tr{sel} data-attempt="{a["attempt"]}"><td class=num>{link}</td>'
                    f'<td><span class="pill" style="background:'
                    f'{OUTCOME_COLOURS.get(a.get("outcome") or "", "#eee")}">'
                    f'{e(a.get("outcome"))}</span></td>'
                    f'<td class="num">{e(fmt_ms(dur))}</td>'
                    f'<td class="mono">{e(_iso_or(a.get("started_at")))}</td>'
                    f'<td class="mono">{e(err)}</td></tr>')
    head = f'<h3 class="mono">{e(key)}</h3>'
    if task is not None:
        head += (f'<div>{pill(task["state"])} {task["attempts"]} attempt(s)'
                 + (" · cached" if task.get("cached") else "")
                 + (f' · <span class="mono">{e(task["error"])}</span>' if task.get("error")
                    else "") + "</div>")
    att_table = ('<table id="attempts"><thead><tr><th class=num>attempt</th><th>outcome</th>'
                 '<th class=num>duration</th><th>started</th><th>error</th></tr></thead>'
                 f'<tbody>{"".join(rows)}</tbody></table>' if rows
                 else '<div class="muted">no finished attempt</div>')
    logs_part = ""
    if ctx.has_logs:
        logs_part = ("<h4>Logs" + (f" of attempt {attempt}" if attempt else "") + "</h4>"
                     + logs_html(logs, attempt))
    src = run_path(rid, "/lineage?" + urlencode({"task": key}))
    return (head + "<h4>Attempts</h4>" + att_table + logs_part
            + "<h4>Lineage (this task and its upstream)</h4>"
            + f'<div data-autoload="{e(src)}"><span class="muted">loading…</span></div>')


def lineage_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """Lineage rows as ``pipeline lineage`` prints them: inputs, outputs, hashes, code."""
    return _table(rows, ["task_key", "attempt", "direction", "uri", "content_hash",
                         "code_version", "attrs"], "lineage")


def _iso_or(ts: object) -> str:
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        return iso(float(ts)) or ""
    return ""


# -- approvals, usage, notices -----------------------------------------------------------

def approvals_html(ctx: Ctx, rid: str, approvals: Sequence[Mapping[str, Any]]) -> str:
    """Pending approvals with their summary and digest, then the decided ones."""
    if not approvals:
        return ""
    pending = [a for a in approvals if a.get("state") in (None, "pending", "waiting")]
    rows = []
    for a in approvals:
        digest = str(a.get("digest") or "")
        buttons = ""
        if ctx.actions and a in pending:
            task = str(a.get("task_key") or "")
            buttons = (f'<button data-action="{e(api_path(rid, "/approve"))}" '
                       f'data-task="{e(task)}" data-digest="{e(digest)}" '
                       f'data-confirm="Approve {e(task)} (digest {e(digest[:12])})?">approve'
                       f"</button> "
                       f'<button class="danger" data-action="{e(api_path(rid, "/reject"))}" '
                       f'data-task="{e(task)}" data-digest="{e(digest)}" '
                       f'data-ask="Why reject {e(task)}?">reject</button>')
        rows.append(f'<tr data-task="{e(a.get("task_key"))}" data-state="{e(a.get("state"))}">'
                    f'<td class="mono">{e(a.get("task_key"))}</td><td>{e(a.get("action"))}</td>'
                    f'<td class="mono">{e(a.get("summary"))}</td>'
                    f'<td class="mono" title="{e(digest)}">{e(digest[:16])}</td>'
                    f'<td class="mono">{e(_when(a.get("requested_at")))}</td>'
                    f'<td class="mono">{e(_when(a.get("deadline")))}</td>'
                    f'<td>{e(a.get("state"))}</td><td>{e(a.get("decided_by"))}</td>'
                    f"<td>{buttons}</td></tr>")
    return (f'<h2>Approvals ({len(pending)} pending)</h2><table id="approvals"><thead><tr>'
            "<th>task</th><th>action</th><th>summary</th><th>digest</th><th>requested</th>"
            "<th>deadline</th><th>state</th><th>decided by</th><th></th></tr></thead>"
            f'<tbody>{"".join(rows)}</tbody></table>')


def _when(v: object) -> str:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return _iso_or(v)
    return "" if v is None else str(v)


def usage_html(usage: Any, totals: Mapping[str, float] | None) -> str:
    """Model and tool calls with their usage, whatever shape ``Run.usage()`` has."""
    head = ""
    if totals:
        head = (f'<div><b>{int(totals["tokens"]):,}</b> tokens · cost '
                f'<b>{totals["cost"]:.4f}</b> · {int(totals["calls"]):,} calls</div>')
    if isinstance(usage, Mapping):
        lists = {k: v for k, v in usage.items() if isinstance(v, list)}
        flat = {k: v for k, v in usage.items() if not isinstance(v, list)}
        out = head + (_table([flat]) if flat else "")
        for k, v in lists.items():
            out += f"<h4>{e(k)}</h4>" + _table([x if isinstance(x, Mapping) else {"value": x}
                                                for x in v])
        return out
    if isinstance(usage, list):
        return head + _table([x if isinstance(x, Mapping) else {"value": x} for x in usage])
    return head + f"<pre>{e(usage)}</pre>"


def notices_html(notices: Sequence[Mapping[str, Any]]) -> str:
    """Rejected late results and other notes."""
    if not notices:
        return ""
    rows = [{**n, "at": _iso_or(n.get("at"))} for n in notices[:500]]
    return (f"<h2>Notices ({len(notices)})</h2>"
            + _table(rows, ["task_key", "attempt", "kind", "message", "at"], "notices"))
