"""The console's HTML toolkit: escaping, links, state pills, number formats, the page frame.

Plain HTML with inline CSS, one small inline script and inline SVG: no CDN,
no framework, nothing fetched from the internet. Every value that comes
from the ledger or from user code is escaped (:func:`e`). :func:`layout`
draws the frame every page shares (the header names the store, its password
masked by the app), :func:`table` any list of rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Final
from urllib.parse import quote, urlencode

from ledgerflow.display import STATE_COLOURS

from .views import iso, ordered_counts

#: Task and run state colours (the notebook's, plus the states of this stage).
COLOURS: Final[dict[str, str]] = {**STATE_COLOURS, "waiting_approval": "#fef08a",
                                  "waiting": "#fef08a"}
#: Attempt outcome colours on the timeline.
OUTCOME_COLOURS: Final[dict[str, str]] = {
    "ok": "#22c55e", "error": "#ef4444", "timeout": "#f97316", "cancelled": "#a8a29e",
    "lost": "#a855f7", "waiting": "#eab308", "running": "#3b82f6"}
#: The order in which an aggregated cell picks its colour (the worst outcome wins).
_OUTCOME_RANK: Final = ("error", "timeout", "lost", "cancelled", "waiting", "running", "ok")


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
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
#runs td.mono:not(.params){white-space:nowrap}
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
body.approver-only .needs-token{display:none}
label.edit textarea{display:block;width:100%;max-width:60em;margin-top:4px}
.legend span{margin-right:12px;white-space:nowrap}
.legend i{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:middle}
"""

_JS: Final = """
(function(){
const TOKEN = new URLSearchParams(location.search).get('token') || '';
const KEY = 'ledgerflow-approver';   // an approver's own token: kept in this tab, never in a URL
const hash = /(?:^#|&)approver=([^&]+)/.exec(location.hash);
if (hash){
  try { sessionStorage.setItem(KEY, decodeURIComponent(hash[1])); } catch(_) {}
  history.replaceState(null, '', location.pathname + location.search);
}
function approver(){ try { return sessionStorage.getItem(KEY) || ''; } catch(_) { return ''; } }
// an approver's token alone decides approvals only: cancel, resume and start are hidden
function mode(){ document.body.classList.toggle('approver-only', !TOKEN && !!approver()); }
mode();
function heads(){
  const h = {'Content-Type':'application/json','X-Ledgerflow-Token':TOKEN}, a = approver();
  if (a) h['Authorization'] = 'Bearer ' + a;
  return h;
}
async function whoami(){
  const el = document.getElementById('approver'), a = approver();
  if (!el || !a) return;
  let doc = {}, r = null;
  try { r = await fetch('/api/whoami', {headers: heads()}); doc = await r.json(); } catch(_) {}
  el.textContent = r && r.ok ? 'deciding as ' + doc.decides_as + ' ' : 'approver token refused: '
    + (doc.error || (r && r.status)) + ' ';
  const f = document.createElement('a'); f.href = '#'; f.textContent = 'forget it';
  f.dataset.forget = '1'; el.appendChild(f); el.hidden = false;
}
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
  if (b.dataset.form){
    const f = document.querySelector(b.dataset.form);
    body.target = f.querySelector('[name=target]').value; body.params = {};
    f.querySelector('[name=params]').value.split('\\n').map(s => s.trim()).filter(Boolean)
      .forEach(s => { const i = s.indexOf('=');
        body.params[i < 0 ? s : s.slice(0, i)] = i < 0 ? '' : s.slice(i + 1); });
  }
  if (b.dataset.edit){      // a tool call's arguments: sent only when edited; checked there
    const t = document.querySelector(b.dataset.edit);
    if (t && t.value.trim() !== t.defaultValue.trim()){
      try { body.arguments = JSON.parse(t.value); } catch(_) { body.arguments = t.value; }
    }
  }
  if (b.dataset.ask){ const r = prompt(b.dataset.ask, ''); if (r === null) return; body.reason = r; }
  const r = await fetch(b.dataset.action, {method:'POST', body: JSON.stringify(body),
    headers: heads()});
  let doc = {}; try { doc = await r.json(); } catch(_) {}
  say(r.ok, r.ok ? (doc.message || 'done')
               : 'Error: ' + (doc.error || r.status) + (doc.hint ? '  Hint: ' + doc.hint : ''));
  follow = Date.now() + 15000;   // keep refreshing while the action takes effect
  setTimeout(refresh, 300);
}
document.addEventListener('click', async ev => {
  if (ev.target.closest('[data-forget]')){
    ev.preventDefault(); try { sessionStorage.removeItem(KEY); } catch(_) {}
    document.getElementById('approver').hidden = true; mode(); return;
  }
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
      const before = live.dataset.version, kept = {}, focus = document.activeElement;
      live.querySelectorAll('textarea[data-keep]').forEach(t => {   // what is being typed
        if (t.value !== t.defaultValue || t === focus) kept[t.id] = [t.value, t === focus,
          t.selectionStart, t.selectionEnd]; });
      live.outerHTML = await r.text();
      Object.entries(kept).forEach(([id, [v, f, a, z]]) => {
        const t = document.getElementById(id); if (!t) return;
        t.value = v; if (f){ t.focus(); t.setSelectionRange(a, z); } });
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
whoami();
})();
"""


def layout(ctx: Ctx, title: str, body: str) -> str:
    """A whole page: header, the message line, ``body`` and the script."""
    mode = "actions enabled" if ctx.actions else "read-only"
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name=viewport content="width=device-width,initial-scale=1">'
            f"<title>{e(title)} · ledgerflow</title><style>{_CSS}</style></head><body>"
            f'<header><a href="{e(href(ctx, "/"))}">ledgerflow console</a>'
            f'<span class="where">{e(ctx.store)} · {mode}</span>'
            '<span id="approver" class="where" hidden></span></header>'
            f'<main><div id="message" class="msg" hidden></div>{body}</main>'
            f"<script>{_JS}</script></body></html>")


def error_page(ctx: Ctx, status: int, error: str, hint: str | None) -> str:
    """What a page shows when its read failed: the Error and Hint lines."""
    body = (f'<h1>{status}</h1><div class="box bad"><b>Error:</b> {e(error)}'
            + (f"<br><b>Hint:</b> {e(hint)}" if hint else "") + "</div>"
            f'<p><a href="{e(href(ctx, "/"))}">all runs</a></p>')
    return layout(ctx, f"error {status}", body)


def inspect_url(rid: str, key: str, attempt: int | None = None) -> str:
    """The URL of the inspector fragment of task ``key`` (an attempt's, if given)."""
    q: dict[str, object] = {"task": key}
    if attempt is not None:
        q["attempt"] = attempt
    return run_path(rid, "/inspect?" + urlencode(q))


def inspect_link(rid: str, key: str, text: str | None = None) -> str:
    """A link that loads task ``key`` into the inspector."""
    return (f'<a href="#inspector" class="mono" data-load="{e(inspect_url(rid, key))}" '
            f'data-into="#inspector" data-scroll="1">{e(text or key)}</a>')


def table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str] | None = None,
          table_id: str = "") -> str:
    """Rows as an HTML table (columns: ``cols``, else every key in order)."""
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


def iso_or(ts: object) -> str:
    """An epoch time as ISO text ("" for anything else)."""
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        return iso(float(ts)) or ""
    return ""
