"""The run page's panels: the selected task's attempts, logs and lineage; approvals; usage; notices.

Each takes what :mod:`ledgerflow_console.ledger` read (the kernel's own
rows: ``Run.attempts``, ``Run.logs``, ``Run.approvals``, ``Run.usage``,
``Run.notices``) and draws it; a panel whose reader this ledgerflow lacks is
not drawn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlencode

from .calls import calls_html, has_calls, usage_tables
from .markup import (
    OUTCOME_COLOURS,
    Ctx,
    api_path,
    e,
    fmt_ms,
    inspect_url,
    iso_or,
    pill,
    run_path,
    table,
)

#: Characters of log text shown per attempt before the page says what it cut.
LOG_CHARS: Final = 200_000
#: Characters of one attempt's traceback shown (the kernel keeps up to 8,000).
TRACEBACK_CHARS: Final = 20_000


def tracebacks_html(attempts: Sequence[Mapping[str, Any]], selected: int | None) -> str:
    """The traceback of every attempt that recorded one; the selected attempt's is open."""
    out = []
    for a in attempts:
        tb = str(a.get("traceback") or "")
        if not tb:
            continue
        cut = ""
        if len(tb) > TRACEBACK_CHARS:
            cut = f" (the last {TRACEBACK_CHARS:,} of {len(tb):,} characters)"
            tb = tb[-TRACEBACK_CHARS:]
        n = a.get("attempt")
        out.append(f'<details class="traceback" data-attempt="{e(n)}"'
                   f'{" open" if n == selected else ""}><summary>attempt {e(n)} · '
                   f"{e(a.get('error_type'))} · traceback{e(cut)}</summary>"
                   f"<pre>{e(tb)}</pre></details>")
    if not out:
        return ""
    return "<h4>Tracebacks</h4>" + "".join(out)


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
        link = (f'<a href="#inspector" data-load="{e(inspect_url(rid, key, a["attempt"]))}" '
                f'data-into="#inspector">{a["attempt"]}</a>')
        rows.append(f'<tr{sel} data-attempt="{a["attempt"]}"><td class=num>{link}</td>'
                    f'<td><span class="pill" style="background:'
                    f'{OUTCOME_COLOURS.get(a.get("outcome") or "", "#eee")}">'
                    f'{e(a.get("outcome"))}</span></td>'
                    f'<td class="num">{e(fmt_ms(dur))}</td>'
                    f'<td class="mono">{e(iso_or(a.get("started_at")))}</td>'
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
    return (head + "<h4>Attempts</h4>" + att_table + tracebacks_html(attempts, attempt)
            + logs_part
            + "<h4>Lineage (this task and its upstream)</h4>"
            + f'<div data-autoload="{e(src)}"><span class="muted">loading…</span></div>')


def lineage_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """Lineage rows as ``pipeline lineage`` prints them: inputs, outputs, hashes, code."""
    return table(rows, ["task_key", "attempt", "direction", "uri", "content_hash",
                         "code_version", "attrs"], "lineage")


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
        editing = ""
        if ctx.actions and a in pending:
            task = str(a.get("task_key") or "")
            edit = ""
            if a.get("editable"):
                editing, edit = _edit_html(a, digest), f' data-edit="#edit-{e(digest[:16])}"'
            buttons = (f'<button data-action="{e(api_path(rid, "/approve"))}" '
                       f'data-task="{e(task)}" data-digest="{e(digest)}"{edit} '
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
                    f"<td>{buttons}</td></tr>" + _request_html(a, editing))
    return (f'<h2>Approvals ({len(pending)} pending)</h2><table id="approvals"><thead><tr>'
            "<th>task</th><th>action</th><th>summary</th><th>digest</th><th>requested</th>"
            "<th>deadline</th><th>state</th><th>decided by</th><th></th></tr></thead>"
            f'<tbody>{"".join(rows)}</tbody></table>')


def _edit_html(a: Mapping[str, Any], digest: str) -> str:
    """The approve form's JSON field of a tool call (a row that says ``editable``): the
    call's arguments, to approve as they are or edited (the server checks an edit against
    the tool's schema, as ``pipeline approve --arguments`` does)."""
    shown = (a.get("arguments") or {}).get("arguments")
    text = shown if isinstance(shown, str) else json.dumps(shown or {}, default=str)
    return (f'<label class="edit"><b>arguments the tool runs with</b> (JSON; edit them, '
            f'then approve: an edit is checked against the tool\'s schema)<br>'
            f'<textarea id="edit-{e(digest[:16])}" class="mono" rows="3" cols="80" '
            f'data-keep="1" spellcheck="false">{e(text)}</textarea></label>')


def _request_html(a: Mapping[str, Any], editing: str = "") -> str:
    """What the approver decides on: argument values, note, approvers, what changed (and
    ``editing``: the approve form's arguments field of a tool call)."""
    args = a.get("arguments") or {}
    changed = a.get("changed")
    if not (args or a.get("note") or a.get("approvers") or changed or editing):
        return ""
    parts = []
    if a.get("note"):
        parts.append(f'<div class="note"><b>note</b>: {e(a["note"])}</div>')
    parts.append("<div><b>who may decide</b>: " + (
        e(", ".join(map(str, a["approvers"]))) if a.get("approvers") else "anyone with the token")
        + "</div>")
    if isinstance(args, Mapping) and args:
        parts.append('<table class="arguments"><thead><tr><th>argument</th><th>value</th>'
                     "</tr></thead><tbody>" + "".join(
                         f'<tr data-arg="{e(k)}"><td class="mono">{e(k)}</td>'
                         f'<td class="mono">{e(v if isinstance(v, str) else json.dumps(v, default=str))}'
                         "</td></tr>" for k, v in args.items()) + "</tbody></table>")
    if changed:
        parts.append('<div class="changed"><b>changed since the last request</b>: ' + "; ".join(
            f'<span class="mono">{e(c.get("field"))}</span>: {e(c.get("before"))} → '
            f"{e(c.get('after'))}" for c in changed if isinstance(c, Mapping)) + "</div>")
    elif changed is not None:
        parts.append('<div class="muted">nothing changed since the last request</div>')
    if editing:
        parts.append(editing)
    return (f'<tr class="request" data-request-for="{e(a.get("task_key"))}"><td colspan="9">'
            + "".join(parts) + "</td></tr>")


def _when(v: object) -> str:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return iso_or(v)
    return "" if v is None else str(v)


def usage_html(usage: Any, totals: Mapping[str, float] | None,
               call_rows: Sequence[Mapping[str, Any]] = ()) -> str:
    """Usage as tables with plain headings, then each model and tool call in detail.

    Nothing at all for a run without a model or tool call.
    """
    if not has_calls(usage) and not call_rows:
        return ""
    head = ""
    if totals:
        head = (f'<div><b>{int(totals["tokens"]):,}</b> tokens · cost '
                f'<b>{totals["cost"]:.4f}</b> · {int(totals["calls"]):,} model calls</div>')
    if isinstance(usage, Mapping) and isinstance(usage.get("totals"), Mapping):
        return head + usage_tables(usage) + calls_html(call_rows)
    if isinstance(usage, Mapping):          # another shape: shown as it is
        lists = {k: v for k, v in usage.items() if isinstance(v, list)}
        flat = {k: v for k, v in usage.items() if not isinstance(v, list)}
        out = head + (table([flat]) if flat else "")
        for k, v in lists.items():
            out += f"<h4>{e(k)}</h4>" + table([x if isinstance(x, Mapping) else {"value": x}
                                                for x in v])
        return out + calls_html(call_rows)
    if isinstance(usage, list):
        return head + table([x if isinstance(x, Mapping) else {"value": x} for x in usage]
                            ) + calls_html(call_rows)
    return head + f"<pre>{e(usage)}</pre>" + calls_html(call_rows)


def notices_html(notices: Sequence[Mapping[str, Any]]) -> str:
    """Rejected late results and other notes."""
    if not notices:
        return ""
    rows = [{**n, "at": iso_or(n.get("at"))} for n in notices[:500]]
    return (f"<h2>Notices ({len(notices)})</h2>"
            + table(rows, ["task_key", "attempt", "kind", "message", "at"], "notices"))
