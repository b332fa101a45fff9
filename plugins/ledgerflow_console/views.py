"""Page models: what each console page shows, as plain JSON-ready data.

The HTML pages (:mod:`.pages`) draw these dicts and the JSON endpoints
return them as they are, so a page never shows what its JSON lacks. Nothing
here reads the ledger (that is :mod:`.ledger`) or writes HTML.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ledgerflow.views import RunView, TaskRow

#: Run states in which a run may still change (the page refreshes itself).
ACTIVE_RUN_STATES: Final = frozenset({"running", "cancelling", "waiting"})
#: The multiplication sign of ``embed \u00d7 960`` (written as an escape for the linters).
TIMES: Final = "\u00d7"
#: Task states in the order the pages list them.
STATE_ORDER: Final = ("succeeded", "running", "retry_wait", "waiting_approval", "ready",
                      "pending", "cancelling", "failed", "upstream_failed", "cancelled")
#: Timeline lanes drawn one per task before the timeline is aggregated by task name.
TIMELINE_ROWS: Final = 300
#: Time buckets of an aggregated lane.
TIMELINE_BUCKETS: Final = 160
#: Task names listed in the table by name (a spec can have many).
GROUP_ROWS: Final = 500
#: Items on one page of a task name's items.
ITEMS_PAGE: Final = 100
#: Failed tasks listed as root causes.
ROOT_CAUSES: Final = 20


def iso(ts: float | None) -> str | None:
    """UTC time with milliseconds, as the CLI's JSON documents write it."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def ordered_counts(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """``counts`` as ``(state, n)`` pairs in :data:`STATE_ORDER`, unknown states last."""
    known = [(s, counts[s]) for s in STATE_ORDER if counts.get(s)]
    return known + sorted((s, n) for s, n in counts.items() if s not in STATE_ORDER and n)


def _json_obj(text: str | None) -> dict[str, Any]:
    """A run row's JSON column (``params``, ``options``) as a dict ({} if unreadable)."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def run_params(v: RunView) -> dict[str, Any]:
    """The parameters the run was started with (``-p NAME=VALUE``), as recorded."""
    return _json_obj(v.params)


def run_trigger(v: RunView) -> dict[str, Any] | None:
    """What started the run (``options["trigger"]``: kind, paths, slot...), if recorded."""
    trig = _json_obj(v.options).get("trigger")
    return trig if isinstance(trig, dict) else None


def trigger_text(trig: Mapping[str, Any] | None) -> str:
    """A trigger in one line, as ``pipeline watch`` records it: ``files: 3 changes (a.md,
    b.md ...)``, ``cron slot 2026-12-02T08:00:00Z, 2 missed``, ``start``; '' if none."""
    if not trig:
        return ""
    what = str(trig.get("kind") or "?")
    if trig.get("slot"):
        what += f" slot {trig['slot']}"
    if trig.get("missed"):
        what += f", {trig['missed']} missed"
    paths = [str(p) for p in trig.get("paths") or []]
    n = int(trig.get("changes") or len(paths))
    if paths or n:
        what += (f": {n} change{'' if n == 1 else 's'}"
                 + (" (" + ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "") + ")"
                    if paths else ""))
    return what


def _duration(start: float | None, end: float | None, now: float) -> float | None:
    if start is None:
        return None
    return max(0.0, (end if end is not None else now) - start)


# -- runs page ---------------------------------------------------------------------------

def runs_json_item(v: RunView) -> dict[str, Any]:
    """One entry of ``pipeline runs --json``."""
    return v.summary_json()


def usage_totals(usage: Any) -> dict[str, float] | None:
    """Tokens and cost summed over whatever shape ``Run.usage()`` returns.

    Accepts a dict of totals, a list of call rows, or dicts nested by task or
    model: ``*tokens`` keys are summed (``total_tokens`` wins over its parts),
    and ``cost``/``cost_usd`` is summed as cost.
    """
    if usage is None:
        return None
    if isinstance(usage, Mapping) and isinstance(usage.get("totals"), Mapping):
        # Run.usage() (ledgerflow.views.usage_summary): its totals, not the sum of its
        # per-task, per-model and per-key groups, which count every call again
        t = usage["totals"]
        return {"tokens": float(t.get("tokens", 0)), "cost": float(t.get("cost", 0.0)),
                "calls": int(t.get("model_calls", 0))}
    tokens = 0.0
    cost = 0.0
    calls = 0
    seen = False

    def walk(node: Any) -> None:
        nonlocal tokens, cost, calls, seen
        if isinstance(node, Mapping):
            nums = {k: v for k, v in node.items() if isinstance(v, int | float)
                    and not isinstance(v, bool)}
            tok = [k for k in nums if str(k).endswith("tokens")]
            if tok:
                seen = True
                tokens += nums["total_tokens"] if "total_tokens" in nums else sum(
                    nums[k] for k in tok)
            for k in ("cost", "cost_usd"):
                if k in nums:
                    seen = True
                    cost += nums[k]
                    break
            if "calls" in nums:
                calls += int(nums["calls"])
            elif tok:
                calls += 1
            for v in node.values():
                if isinstance(v, Mapping | list | tuple):
                    walk(v)
        elif isinstance(node, list | tuple):
            for v in node:
                walk(v)

    walk(usage)
    return {"tokens": tokens, "cost": cost, "calls": calls} if seen else {
        "tokens": 0.0, "cost": 0.0, "calls": 0}


def runs_page(views: Sequence[RunView], *, state: str | None, pipeline: str | None,
              extras: Mapping[str, Mapping[str, Any]], now: float | None = None
              ) -> dict[str, Any]:
    """The runs page: each run with counts, duration, driver, approvals and usage.

    ``extras`` maps a run id to ``pending_approvals`` / ``usage`` found for it.
    """
    now = time.time() if now is None else now
    rows = []
    for v in views:
        if state and v.state != state:
            continue
        if pipeline and v.pipeline != pipeline:
            continue
        item = runs_json_item(v)
        end = v.ended_at if v.state not in ACTIVE_RUN_STATES else None
        item["duration_s"] = (round(_duration(v.created_at, end, now) or 0.0, 3)
                              if v.created_at else None)
        extra = extras.get(v.run_id, {})
        item["pending_approvals"] = extra.get("pending_approvals")
        item["usage"] = extra.get("usage")
        item["params"] = run_params(v)
        item["trigger"] = run_trigger(v)
        rows.append(item)
    return {"runs": rows, "states": sorted({v.state for v in views}),
            "pipelines": sorted({v.pipeline for v in views}),
            "filter": {"state": state, "pipeline": pipeline}, "total": len(views)}


# -- run page ----------------------------------------------------------------------------

def run_header(view: RunView, now: float | None = None) -> dict[str, Any]:
    """The run's own fields: state, times, duration, driver, counts."""
    now = time.time() if now is None else now
    end = view.ended_at if view.state not in ACTIVE_RUN_STATES else None
    dur = _duration(view.created_at or None, end, now)
    return {"run_id": view.run_id, "pipeline": view.pipeline, "state": view.state,
            "reason": view.reason, "created_at": iso(view.created_at or None),
            "ended_at": iso(view.ended_at), "duration_s": None if dur is None else round(dur, 3),
            "driver_alive": view.driver_alive, "active": view.state in ACTIVE_RUN_STATES,
            "resumable": view.state != "succeeded" and not view.driver_alive,
            "total": len(view.tasks), "counts": view.counts(), "target": view.target,
            "params": run_params(view), "trigger": run_trigger(view)}


def root_cause(view: RunView) -> dict[str, Any]:
    """The tasks that failed by themselves, apart from those failed by an upstream.

    ``failed`` lists the tasks in state ``failed`` (their own attempts failed),
    first to end first: the first is the root cause of the run's failure.
    ``upstream_failed`` counts the tasks that never ran because of them.
    """
    failed = [r for r in view.tasks.values() if r.state == "failed"]
    failed.sort(key=lambda r: (r.ended_at or math.inf, r.key))
    down: dict[str, int] = {}
    n_up = 0
    for r in view.tasks.values():
        if r.state == "upstream_failed":
            n_up += 1
            name = r.task_name or r.key
            down[name] = down.get(name, 0) + 1
    return {"failed_total": len(failed), "upstream_failed_total": n_up,
            "upstream_failed_by_task": down,
            "cancelled_total": sum(1 for r in view.tasks.values() if r.state == "cancelled"),
            "failed": [{"key": r.key, "task": r.task_name, "attempts": r.attempts,
                        "error": r.error, "ended_at": iso(r.ended_at)}
                       for r in failed[:ROOT_CAUSES]]}


def groups(view: RunView, now: float | None = None) -> list[dict[str, Any]]:
    """One row per task name: fan-outs and repeated calls aggregated.

    Each row has the task count, counts by state, how many were cached or
    retried, total and median duration, and the first error.
    """
    now = time.time() if now is None else now
    by: dict[str, list[TaskRow]] = {}
    for r in view.tasks.values():
        by.setdefault(r.task_name or r.key, []).append(r)
    out = []
    for name, rows in list(by.items())[:GROUP_ROWS]:
        states: dict[str, int] = {}
        durs: list[float] = []
        cached = retried = attempts = 0
        err: dict[str, Any] | None = None
        for r in rows:
            states[r.state] = states.get(r.state, 0) + 1
            attempts += r.attempts
            if r.cached_from:
                cached += 1
            if r.attempts > 1:
                retried += 1
            if r.started_at is not None and r.ended_at is not None:
                durs.append(max(0.0, r.ended_at - r.started_at))
            if err is None and r.error and r.state != "succeeded":
                err = {"key": r.key, "error": r.error}
        durs.sort()
        out.append({"task": name, "tasks": len(rows), "counts": states, "cached": cached,
                    "retried": retried, "attempts": attempts,
                    "fan_out": any(r.position is not None for r in rows),
                    "busy_ms": round(sum(durs) * 1000, 3),
                    "median_ms": round(durs[len(durs) // 2] * 1000, 3) if durs else None,
                    "max_ms": round(durs[-1] * 1000, 3) if durs else None,
                    "first_error": err})
    return out


def task_item(r: TaskRow, now: float) -> dict[str, Any]:
    """A task as ``pipeline status --json`` writes it, plus its duration and item key."""
    doc = r.as_json()
    dur = _duration(r.started_at, r.ended_at, now)
    doc["duration_ms"] = None if dur is None else round(dur * 1000, 3)
    doc["item_key"] = r.item_key
    return doc


def items(view: RunView, *, task: str | None = None, state: str | None = None,
          offset: int = 0, limit: int = ITEMS_PAGE, now: float | None = None) -> dict[str, Any]:
    """One page of tasks (of one task name, in one state), in ledger order."""
    now = time.time() if now is None else now
    rows = [r for r in view.tasks.values()
            if (task is None or (r.task_name or r.key) == task)
            and (state is None or r.state == state)]
    offset = max(0, offset)
    limit = max(1, min(limit, 1000))
    page = rows[offset:offset + limit]
    return {"task": task, "state": state, "total": len(rows), "offset": offset,
            "limit": limit, "tasks": [task_item(r, now) for r in page]}


# -- timeline ----------------------------------------------------------------------------

def _ms(ts: float, t0: float) -> float:
    return round((ts - t0) * 1000, 3)


def timeline(view: RunView, attempts: Iterable[Mapping[str, Any]], *,
             rows: int = TIMELINE_ROWS, buckets: int = TIMELINE_BUCKETS,
             now: float | None = None) -> dict[str, Any]:
    """Every attempt of the run on one time axis (milliseconds from the first start).

    One lane per task with one bar per attempt (retries included) and the
    waits between them; tasks running now get an open bar. With more lanes
    than ``rows`` the timeline is aggregated: one lane per task name with
    attempts counted into ``buckets`` time slices by outcome, and only the
    notable tasks (retried, not ``ok``, running now) keep a lane of their own.
    """
    now = time.time() if now is None else now
    # pass 1: attempts by task, the time span, which tasks stand out
    per: dict[str, list[Mapping[str, Any]]] = {}
    odd: set[str] = set()
    t0 = math.inf
    t1 = -math.inf
    for a in attempts:
        s = a["started_at"]
        if s is None:
            continue
        key = a["task_key"]
        lst = per.get(key)
        if lst is None:
            per[key] = [a]
            if a["outcome"] != "ok":
                odd.add(key)
        else:
            lst.append(a)
            odd.add(key)
        e = a["ended_at"]
        if s < t0:
            t0 = s
        if e is None:
            e = s
        if e > t1:
            t1 = e
    live: dict[str, dict[str, Any]] = {}
    for r in view.tasks.values():
        if r.state in ("running", "cancelling", "retry_wait", "waiting_approval"):
            ends = [a["ended_at"] for a in per.get(r.key, ()) if a.get("ended_at") is not None]
            last_end = max(ends) if ends else None
            if r.state in ("running", "cancelling"):
                known = [x for x in (last_end, r.started_at) if x is not None]
                if known:
                    live[r.key] = {"kind": "running", "start": max(known),
                                   "attempt": r.attempts}
            elif last_end is not None:
                live[r.key] = {"kind": "waiting", "start": last_end, "attempt": r.attempts,
                               "state": r.state}
    for x in live.values():
        t0 = min(t0, x["start"])
        t1 = max(t1, now)
    if t0 == math.inf:
        return {"t0": None, "t0_iso": None, "span_ms": 0.0, "attempts_total": 0,
                "aggregated": False, "lanes": [], "groups": [], "lanes_total": 0}
    t1 = max(t1, t0)
    keys = list(dict.fromkeys([*per, *live]))
    names = {r.key: (r.task_name or r.key) for r in view.tasks.values()} \
        if len(keys) <= rows else {}

    def name_of(key: str) -> str:
        r = view.tasks.get(key)
        return (r.task_name or r.key) if r is not None else key

    def lane(key: str) -> dict[str, Any]:
        lst = sorted(per.get(key, []), key=lambda a: (a["started_at"], a["attempt"]))
        bars, waits = [], []
        prev_end: float | None = None
        for a in lst:
            s = float(a["started_at"])
            e = float(a["ended_at"]) if a.get("ended_at") is not None else s
            if prev_end is not None and s > prev_end:
                waits.append({"start_ms": _ms(prev_end, t0), "end_ms": _ms(s, t0),
                              "kind": "retry_wait"})
            err = None
            if a.get("outcome") != "ok":
                err = ": ".join(x for x in (a.get("error_type"), a.get("error_message")) if x)
            bars.append({"attempt": a["attempt"], "outcome": a.get("outcome"),
                         "start_ms": _ms(s, t0), "end_ms": _ms(e, t0),
                         "duration_ms": round((e - s) * 1000, 3),
                         "started_at": iso(s), "ended_at": iso(e), "error": err or None})
            prev_end = e
        open_bar = None
        x = live.get(key)
        if x is not None:
            if x["kind"] == "running":
                if prev_end is not None and x["start"] > prev_end:
                    waits.append({"start_ms": _ms(prev_end, t0), "end_ms": _ms(x["start"], t0),
                                  "kind": "retry_wait"})
                open_bar = {"attempt": x["attempt"], "outcome": "running",
                            "start_ms": _ms(x["start"], t0), "end_ms": _ms(now, t0),
                            "started_at": iso(x["start"])}
            else:
                waits.append({"start_ms": _ms(x["start"], t0), "end_ms": _ms(now, t0),
                              "kind": x["state"]})
        return {"task_key": key, "task": names.get(key) or name_of(key), "bars": bars,
                "waits": waits, "running": open_bar}

    total = sum(len(v) for v in per.values())
    base = {"t0": t0, "t0_iso": iso(t0), "span_ms": _ms(t1, t0), "attempts_total": total,
            "lanes_total": len(keys)}
    if len(keys) <= rows:
        return {**base, "aggregated": False, "lanes": [lane(k) for k in keys], "groups": []}
    # pass 2: count attempts into time slices, per task name and outcome
    notable = [k for k in keys if k in live or k in odd]
    width = max(t1 - t0, 1e-6) / buckets
    last = buckets - 1
    agg: dict[str, tuple[dict[str, int], dict[int, dict[str, int]], list[int]]] = {}
    tasks = view.tasks
    for key, lst in per.items():
        row = tasks.get(key)
        name = (row.task_name or key) if row is not None else key
        g = agg.get(name)
        if g is None:
            g = agg[name] = ({}, {}, [0, 0])
        outcomes, cells, n = g
        n[0] += 1
        for a in lst:
            oc = a["outcome"] or "?"
            outcomes[oc] = outcomes.get(oc, 0) + 1
            b0 = int((a["started_at"] - t0) / width)
            e = a["ended_at"]
            b1 = b0 if e is None else int((e - t0) / width)
            if b1 > last:
                b1 = last
                if b0 > last:
                    b0 = last
            for b in range(b0, b1 + 1):
                cell = cells.get(b)
                if cell is None:
                    cells[b] = {oc: 1}
                else:
                    cell[oc] = cell.get(oc, 0) + 1
        n[1] += len(lst)
    out_groups = []
    for name, (outcomes, cells, n) in agg.items():
        out_groups.append({
            "task": name, "tasks": n[0], "attempts": n[1], "outcomes": outcomes,
            "buckets": [{"start_ms": round(b * width * 1000, 3),
                         "end_ms": round((b + 1) * width * 1000, 3),
                         "n": sum(cells[b].values()), "outcomes": cells[b]}
                        for b in sorted(cells)]})
    return {**base, "aggregated": True, "bucket_ms": round(width * 1000, 3),
            "groups": out_groups, "lanes": [lane(k) for k in notable[:rows]],
            "notable_total": len(notable)}
