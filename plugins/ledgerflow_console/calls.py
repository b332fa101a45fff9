"""Agent runs in detail: each model and tool call of a run, and its usage as plain tables.

:func:`calls` merges ``Run.model_calls()`` and ``Run.tool_calls()`` into one
list in the order they happened (task, attempt, sequence number). Where the
task recorded content (``record_content=True``) a model call carries the
prompt it was sent (the messages since the previous call) and its answer,
and a tool call its arguments and result (read from the calls around it);
otherwise only digests are known and the page says so. Texts are cut at
:data:`TEXT_CHARS`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .markup import e, fmt_ms

#: Characters of one prompt, answer, argument list or result kept.
TEXT_CHARS: Final = 4000
#: Calls listed on the page (the JSON has them all).
CALL_ROWS: Final = 500

#: Plain headings for the usage figures (``pipeline usage --json`` keys).
USAGE_HEADINGS: Final = {"task": "task", "model": "model", "key": "key",
                         "model_calls": "model calls", "input_tokens": "input tokens",
                         "output_tokens": "output tokens", "tokens": "tokens in all",
                         "cost": "cost", "replayed": "replayed (not billed)",
                         "tool_calls": "tool calls"}


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else (
        text[:TEXT_CHARS] + f"… ({len(text) - TEXT_CHARS:,} more characters)")


def _show(v: object) -> str:
    return _cut(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str))


def _content(c: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = c.get("content")
    if not raw:
        return None
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def calls(model_calls: Sequence[Mapping[str, Any]], tool_calls: Sequence[Mapping[str, Any]]
          ) -> list[dict[str, Any]]:
    """Every call of the run, model and tool, in order, with what was recorded of it."""
    rows: list[dict[str, Any]] = []
    args: dict[tuple[str, int], list[tuple[str, Any, str]]] = {}
    results: dict[tuple[str, int, str], str] = {}
    seen: dict[tuple[str, int], int] = {}
    for c in model_calls:
        doc = _content(c)
        row: dict[str, Any] = {
            "kind": "model", "task_key": c["task_key"], "attempt": c["attempt"],
            "seq": c["seq"], "model": f"{c.get('provider')}/{c.get('model')}",
            "input_tokens": c.get("input_tokens"), "output_tokens": c.get("output_tokens"),
            "cost": c.get("cost"), "latency_ms": round(float(c.get("latency") or 0) * 1000, 3),
            "finish_reason": c.get("finish_reason"), "tools_asked": list(c.get("tool_calls") or []),
            "replayed": bool(c.get("replayed")), "recorded": doc is not None,
            "prompt": None, "answer": None}
        if doc is not None:
            msgs = [m for m in doc.get("messages") or [] if isinstance(m, Mapping)]
            k = (c["task_key"], int(c["attempt"]))
            new = msgs[seen.get(k, 0):]
            seen[k] = len(msgs) + 1                  # the answer is the next call's message
            row["prompt"] = [{"role": m.get("role"), "name": m.get("name"),
                              "text": _show(m.get("content") or "")} for m in new]
            for m in msgs:
                if m.get("role") == "tool" and m.get("tool_call_id"):
                    results[(*k, str(m["tool_call_id"]))] = _show(m.get("content") or "")
            resp = doc.get("response") if isinstance(doc.get("response"), Mapping) else {}
            row["answer"] = _show(resp.get("text") or "")
            for tc in resp.get("tool_calls") or []:
                if isinstance(tc, Mapping):
                    args.setdefault(k, []).append((str(tc.get("name")), tc.get("arguments"),
                                                   str(tc.get("id") or "")))
        rows.append(row)
    for t in tool_calls:
        k = (t["task_key"], int(t["attempt"]))
        asked = args.get(k) or []
        hit = next((i for i, (n, _a, _i) in enumerate(asked) if n == t["tool"]), None)
        arguments = result = None
        if hit is not None:
            _n, a, cid = asked.pop(hit)
            arguments = _show(a)
            result = results.get((*k, cid))
        rows.append({"kind": "tool", "task_key": t["task_key"], "attempt": t["attempt"],
                     "seq": t["seq"], "tool": t["tool"], "outcome": t.get("outcome"),
                     "error": t.get("error") or None, "approved_by": t.get("approved_by") or None,
                     "replayed": bool(t.get("replayed")), "arguments": arguments,
                     "result": result, "arguments_digest": t.get("arguments_digest"),
                     "result_hash": t.get("result_hash")})
    rows.sort(key=lambda r: (str(r["task_key"]), int(r["attempt"]), int(r["seq"])))
    return rows


def has_calls(usage: Any) -> bool:
    """True if a ``Run.usage()`` report counts any model or tool call."""
    if not isinstance(usage, Mapping) or not isinstance(usage.get("totals"), Mapping):
        return bool(usage)
    t = usage["totals"]
    return any(int(t.get(k) or 0) for k in ("model_calls", "tool_calls", "replayed"))


def _num(k: str, v: object) -> str:
    if k == "cost" and isinstance(v, int | float):
        return f"{v:.4f}"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return f"{v:,}"
    return "" if v is None else str(v)


def usage_tables(usage: Mapping[str, Any]) -> str:
    """``Run.usage()`` as tables with plain headings: totals, then by task, model, key."""
    out = []
    groups = [("totals", [usage.get("totals") or {}])] + [
        (k, v) for k, v in usage.items() if k.startswith("by_") and isinstance(v, list)]
    for name, rows in groups:
        if not rows:
            continue
        cols = list(dict.fromkeys(k for r in rows for k in r))
        head = "".join(f'<th{"" if c in ("task", "model", "key") else " class=num"}>'
                       f"{e(USAGE_HEADINGS.get(c, c.replace('_', ' ')))}</th>" for c in cols)
        body = "".join(
            "<tr>" + "".join(f'<td class="{"mono" if c in ("task", "model", "key") else "num"}">'
                             f"{e(_num(c, r.get(c)))}</td>" for c in cols) + "</tr>"
            for r in rows)
        title = "in all" if name == "totals" else name.replace("_", " ")
        out.append(f'<h4>{e(title)}</h4><table class="usage" data-group="{e(name)}">'
                   f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "".join(out)


def _prompt_html(prompt: Sequence[Mapping[str, Any]]) -> str:
    return "".join(f'<div class="msg-{e(m.get("role"))}"><b>{e(m.get("role"))}'
                   + (f" ({e(m['name'])})" if m.get("name") else "")
                   + f'</b><pre>{e(m.get("text"))}</pre></div>' for m in prompt)


def calls_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """Each call as a row; the recorded prompt and answer, arguments and result below it."""
    if not rows:
        return ""
    out = []
    for r in rows[:CALL_ROWS]:
        where = f'{e(r["task_key"])} · attempt {e(r["attempt"])} · #{e(r["seq"])}'
        if r["kind"] == "model":
            what = (f'model <b class="mono">{e(r["model"])}</b> · {_num("", r["input_tokens"])} '
                    f'in / {_num("", r["output_tokens"])} out tokens · cost '
                    f'{_num("cost", r["cost"])} · {e(fmt_ms(r["latency_ms"]))} · ended '
                    f'{e(r["finish_reason"])}'
                    + (f' · asked for {e(", ".join(r["tools_asked"]))}' if r["tools_asked"]
                       else "") + (" · replayed" if r["replayed"] else ""))
            if r["recorded"]:
                detail = ("<h5>prompt (new messages)</h5>" + _prompt_html(r["prompt"] or [])
                          + "<h5>answer</h5>" + _answer_html(r))
            else:
                detail = ('<div class="muted">prompt and answer not recorded (the task did '
                          "not set record_content=True); only their digests are kept</div>")
        else:
            bad = r["outcome"] != "ok"
            what = (f'tool <b class="mono">{e(r["tool"])}</b> · '
                    f'<span class="{"bad" if bad else ""}">{e(r["outcome"])}</span>'
                    + (f' · {e(r["error"])}' if r["error"] else "")
                    + (f' · approved by {e(r["approved_by"])}' if r["approved_by"] else "")
                    + (" · replayed" if r["replayed"] else ""))
            if r["arguments"] is not None:
                detail = (f'<h5>arguments</h5><pre class="arguments">{e(r["arguments"])}</pre>'
                          f'<h5>result</h5><pre class="result">{e(r["result"] or "")}</pre>')
            else:
                detail = (f'<div class="muted">arguments not recorded; digest '
                          f'<span class="mono">{e(r["arguments_digest"])}</span></div>')
        out.append(f'<details class="call" data-kind="{e(r["kind"])}" '
                   f'data-task="{e(r["task_key"])}" data-seq="{e(r["seq"])}"'
                   f'{" data-outcome=" + chr(34) + e(r.get("outcome")) + chr(34) if r["kind"] == "tool" else ""}>'
                   f'<summary><span class="muted mono">{where}</span> {what}</summary>'
                   f"{detail}</details>")
    more = len(rows) - CALL_ROWS
    return (f"<h4>Calls ({len(rows):,})</h4>" + "".join(out)
            + (f'<div class="muted">and {more:,} more (all in /api/runs/ID/calls)</div>'
               if more > 0 else ""))


def _answer_html(r: dict[str, Any]) -> str:
    """A model call's text answer; a muted line when it gave none (it asked for tools)."""
    if r["answer"]:
        return f'<pre class="answer">{e(r["answer"])}</pre>'
    asked = ", ".join(r["tools_asked"])
    return ('<div class="answer muted">no text' + (f": it asked for {e(asked)}" if asked
                                                    else "") + "</div>")
