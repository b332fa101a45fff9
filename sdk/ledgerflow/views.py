"""Read models: a run and its tasks as any process sees them, and their JSON shapes.

:class:`RunView` and :class:`TaskRow` are what stores return and what the
CLI, the notebook display and the console render. The documents of
``pipeline status --json`` (:meth:`RunView.as_json`), of attempts, notices
and lineage rows are built here and nowhere else.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .records import (
    ApprovalDecided,
    ApprovalRequested,
    ArtifactRecorded,
    AttemptEnded,
    LogRecorded,
    Notice,
    StepRecorded,
    Transition,
)
from .states import FAILED_LIKE, PENDING_APPROVAL, RUN_ACTIVE, Outcome, TaskState
from .task import MapRef, TaskRef

#: Attempt outcomes that are no error, and those whose error text starts with the outcome.
_NO_ERROR = frozenset({Outcome.OK.value, Outcome.WAITING.value})
_NAMED_BY_OUTCOME = frozenset({Outcome.TIMEOUT.value, Outcome.LOST.value,
                               Outcome.CANCELLED.value})


@dataclass(slots=True, repr=False)
class TaskRow:
    """The current state of one task of a run, as stored."""

    key: str
    task_name: str = ""
    node: str = ""
    item_key: str | None = None
    position: int | None = None
    upstream: list[str] = field(default_factory=list)
    code_version: str = ""
    state: str = TaskState.PENDING.value
    attempts: int = 0
    budget_base: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    fingerprint: str | None = None
    result_hash: str | None = None
    result_kind: str | None = None
    result_data: str | None = None
    result_uri: str | None = None
    result_size: int = 0
    cached_from: str | None = None
    result_attempt: int = 0

    def __repr__(self) -> str:
        error = f", error={self.error!r}" if self.error else ""
        cached = f", cached_from={self.cached_from!r}" if self.cached_from else ""
        return f"TaskRow({self.key!r}, {self.state}, attempts={self.attempts}{cached}{error})"

    def as_json(self) -> dict[str, Any]:
        """The shape ``pipeline status --json`` prints for a task."""
        return {"key": self.key, "task": self.task_name, "state": self.state,
                "attempts": self.attempts, "started_at": iso(self.started_at),
                "ended_at": iso(self.ended_at), "error": self.error,
                "cached": self.cached_from is not None}


@dataclass(slots=True)
class TaskGroup:
    """The tasks of one name in a run, summed (``pipeline status`` of a big run)."""

    name: str
    count: int
    states: dict[str, int]
    cached: int
    busy: float
    #: ``key: error`` of the first task of the name that did not succeed, or "".
    first_error: str = ""


@dataclass(slots=True, repr=False)
class RunView:
    """A run and its tasks, as any process can read them.

    Its ``repr`` is one line (the run, its state, its counts): a script that prints
    ``run.status()`` gets a summary, not every task; ``.tasks`` holds the rows.
    """

    run_id: str
    pipeline: str = ""
    target: str | None = None
    params: str = "{}"
    options: str = "{}"
    created_at: float = 0.0
    state: str = "running"
    reason: str = ""
    ended_at: float | None = None
    token: int = 0
    max_seq: int = 0
    tasks: dict[str, TaskRow] = field(default_factory=dict)
    driver_pid: int | None = None
    driver_host: str | None = None
    driver_alive: bool | None = None
    #: Set by listings that read counts without loading task rows.
    task_counts: dict[str, int] | None = None
    #: Set when a journal of the run is damaged: where, and what is not applied.
    damage: str | None = None
    #: Set by a summary read (no task rows): the tasks per name, in the run's order,
    #: and the earliest task that failed by itself.
    groups: list[TaskGroup] | None = None
    first_failure: TaskRow | None = None
    #: Set by a frontier read (a resume): the successes it keeps, whose rows are not
    #: in ``tasks`` (:func:`ledgerflow.store.frontier`).
    settled: frozenset[str] = frozenset()
    #: Set by a frontier read: whether the run recorded approval requests or steps (a
    #: resume reads them only then); None when not known.
    signals: bool | None = None

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts().items()))
        damage = ", damaged" if self.damage else ""
        return (f"RunView({self.run_id!r}, pipeline={self.pipeline!r}, {self.state}, "
                f"tasks: {counts or 'none'}{damage})")

    @property
    def active(self) -> bool:
        """True while the run may still have a driver (running or cancelling)."""
        return self.state in RUN_ACTIVE

    def counts(self) -> dict[str, int]:
        """Number of tasks in each state."""
        if self.task_counts is not None and not self.tasks:
            return dict(self.task_counts)
        out: dict[str, int] = {}
        for row in self.tasks.values():
            out[row.state] = out.get(row.state, 0) + 1
        if self.settled:
            done = TaskState.SUCCEEDED.value
            out[done] = out.get(done, 0) + len(self.settled)
        return out

    def in_order(self) -> list[TaskRow]:
        """The tasks in the order they can run: each after the tasks it reads from, else
        in the order they were made (so a fan-out's items come before the task that
        gathers them, which was made first). What status tables and explanations list."""
        rows = list(self.tasks.values())
        index = {r.key: i for i, r in enumerate(rows)}
        items: dict[str, list[int]] = {}        # a fan-out's node -> its items
        for i, r in enumerate(rows):
            if r.position is not None and r.node != r.key:
                items.setdefault(r.node, []).append(i)
        after: list[list[int]] = [[] for _ in rows]
        waits = [0] * len(rows)
        for i, r in enumerate(rows):
            for up in r.upstream:
                for j in ([index[up]] if up in index else items.get(up, ())):
                    if j != i:
                        after[j].append(i)
                        waits[i] += 1
        ready = [i for i, n in enumerate(waits) if n == 0]
        heapq.heapify(ready)
        out: list[TaskRow] = []
        while ready:
            i = heapq.heappop(ready)
            out.append(rows[i])
            for k in after[i]:
                waits[k] -= 1
                if waits[k] == 0:
                    heapq.heappush(ready, k)
        if len(out) < len(rows):    # (a cycle in what a damaged ledger says: as made)
            seen = {id(r) for r in out}
            out += [r for r in rows if id(r) not in seen]
        return out

    def root_causes(self) -> list[TaskRow]:
        """Tasks that failed by themselves (not ``upstream_failed``), earliest first."""
        bad = [t for t in self.tasks.values() if t.state == TaskState.FAILED]
        return sorted(bad, key=lambda t: (t.ended_at or 0.0, t.key))

    def as_json(self) -> dict[str, Any]:
        """The document ``pipeline status --json`` prints."""
        return {"run_id": self.run_id, "pipeline": self.pipeline, "state": self.state,
                "reason": self.reason, "created_at": iso(self.created_at),
                "ended_at": iso(self.ended_at), "driver_alive": self.driver_alive,
                "damage": self.damage, "counts": self.counts(),
                "tasks": [t.as_json() for t in self.tasks.values()]}

    def summary_json(self) -> dict[str, Any]:
        """The document ``pipeline runs --json`` prints for one run."""
        return {"run_id": self.run_id, "pipeline": self.pipeline, "state": self.state,
                "created_at": iso(self.created_at), "ended_at": iso(self.ended_at),
                "counts": self.counts(), "driver_alive": self.driver_alive,
                "damage": self.damage}


def iso(ts: float | None) -> str | None:
    """An epoch time as ``2026-12-01T10:58:36.123Z`` (None stays None)."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def error_text(outcome: str, error_type: str, error_message: str) -> str | None:
    """The one-line error a task row shows for an attempt's outcome (None if ok).

    An attempt that stopped at an approval gate (``waiting``) is no error: the
    task's state says it waits, and if the request is refused, the refusal is
    the task's error. The DuckDB fold computes the same text in SQL; the store
    contract keeps them equal.
    """
    if outcome in _NO_ERROR:
        return None
    if outcome in _NAMED_BY_OUTCOME:
        return f"{outcome}: {error_message}" if error_message else outcome
    return f"{error_type}: {error_message}" if error_type else error_message


def attempt_dict(r: AttemptEnded) -> dict[str, Any]:
    """An attempt as the CLI's and the API's JSON show it."""
    return {"task_key": r.task_key, "attempt": r.attempt, "outcome": r.outcome,
            "started_at": r.started_at, "ended_at": r.ended_at,
            "error_type": r.error_type, "error_message": r.error_message,
            "traceback": r.traceback}


def event_dict(r: Transition) -> dict[str, Any]:
    """A task transition as ``Run.events()`` shows it."""
    return {"seq": r.seq, "task_key": r.task_key, "attempt": r.attempt,
            "from_state": r.from_state, "to_state": r.to_state, "reason": r.reason,
            "ts": r.ts}


def log_dict(r: LogRecorded) -> dict[str, Any]:
    """An attempt's output as ``pipeline logs --json`` shows it."""
    return {"task_key": r.task_key, "attempt": r.attempt, "stream": r.stream,
            "text": r.text, "dropped": r.dropped}


def approval_rows(requests: Iterable[ApprovalRequested],
                  decisions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each approval request with its decision (``pending`` when none), the latest
    request of each task marked ``current`` (an older one was superseded)."""
    decided: dict[tuple[str, str], Mapping[str, Any]] = {}
    for made in decisions:
        decided.setdefault((made["task_key"], made["digest"]), made)
    out: list[dict[str, Any]] = []
    latest: dict[str, int] = {}
    for r in requests:
        d = decided.get((r.task_key, r.digest))
        row = {"task_key": r.task_key, "attempt": r.attempt, "digest": r.digest,
               "action": r.action, "summary": r.summary, "inputs": dict(r.inputs),
               "requested_at": r.requested_at, "deadline": r.deadline,
               "on_timeout": r.on_timeout, "approvers": list(r.approvers), "note": r.note,
               "state": d["decision"] if d else PENDING_APPROVAL,
               "decided_by": d.get("decided_by") if d else None,
               "reason": d.get("reason") if d else None,
               "decided_at": d.get("decided_at") if d else None, "current": True}
        if r.task_key in latest:
            prev = out[latest[r.task_key]]
            if prev["digest"] != r.digest:
                prev["current"] = False
            else:
                out[latest[r.task_key]] = row      # the same request asked again: one row
                continue
        latest[r.task_key] = len(out)
        out.append(row)
    return out


def decision_dict(r: ApprovalDecided) -> dict[str, Any]:
    """A journaled decision, in the shape decision files have."""
    return {"task_key": r.task_key, "digest": r.digest, "decision": r.decision,
            "decided_by": r.decided_by, "reason": r.reason, "decided_at": r.decided_at}


def step_dict(r: StepRecorded) -> dict[str, Any]:
    return {"task_key": r.task_key, "attempt": r.attempt, "name": r.name, "kind": r.kind,
            "data": r.data, "content_hash": r.content_hash}


def usage_summary(model_calls: Iterable[Mapping[str, Any]],
                  tool_calls: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Tokens, cost and calls, in total and per task, model and key alias
    (``pipeline usage --json``). Replayed calls are counted apart: nothing billed.
    Tool calls are counted in total and per task only (they have no model or key)."""
    def blank() -> dict[str, Any]:
        return {"model_calls": 0, "input_tokens": 0, "output_tokens": 0, "tokens": 0,
                "cost": 0.0, "replayed": 0, "tool_calls": 0}
    totals = blank()
    by: dict[str, dict[str, dict[str, Any]]] = {"task": {}, "model": {}, "key": {}}
    for c in model_calls:
        names = {"task": c["task_key"], "model": f"{c['provider']}/{c['model']}",
                 "key": c["key_alias"] or "-"}
        for group in (totals, *(by[k].setdefault(v, blank()) for k, v in names.items())):
            if c.get("replayed"):
                group["replayed"] += 1
                continue
            group["model_calls"] += 1
            group["input_tokens"] += int(c["input_tokens"])
            group["output_tokens"] += int(c["output_tokens"])
            group["tokens"] += int(c["input_tokens"]) + int(c["output_tokens"])
            group["cost"] += float(c["cost"])
    for t in tool_calls:
        totals["tool_calls"] += 1
        by["task"].setdefault(t["task_key"], blank())["tool_calls"] += 1
    for k in ("model", "key"):      # a tool call has a task, not a model or key alias
        for row in by[k].values():
            del row["tool_calls"]
    return {"totals": totals,
            **{f"by_{k}": [{k: name, **v} for name, v in sorted(rows.items())]
               for k, rows in by.items()}}


def notice_dict(r: Notice) -> dict[str, Any]:
    """A notice as the CLI's and the API's JSON show it."""
    return {"task_key": r.task_key, "attempt": r.attempt, "kind": r.kind,
            "message": r.message, "at": r.ts}


def lineage_rows(view: RunView, artifacts: Iterable[ArtifactRecorded],
                 task_key: str | None,
                 approvals: Iterable[Mapping[str, Any]] = (),
                 calls: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Upstream results read, the result produced, recorded artifacts, and the
    approval decisions a task ran under (direction ``approval``)."""
    out: list[dict[str, Any]] = []
    children: dict[str, list[TaskRow]] = {}
    for row in view.tasks.values():
        if row.position is not None:
            children.setdefault(row.node, []).append(row)
    for row in view.tasks.values():
        if task_key is not None and row.key != task_key:
            continue
        for up in row.upstream:
            # an upstream fan-out stands for all its children, in item order
            srcs = [view.tasks[up]] if up in view.tasks else sorted(
                children.get(up, []), key=lambda r: r.position or 0)
            for src in srcs:
                out.append({"task_key": row.key, "attempt": row.result_attempt,
                            "direction": "input", "uri": f"task:{src.key}",
                            "content_hash": src.result_hash,
                            "code_version": row.code_version, "attrs": {}})
        if row.state == TaskState.SUCCEEDED:
            out.append({"task_key": row.key, "attempt": row.result_attempt,
                        "direction": "output", "uri": f"task:{row.key}",
                        "content_hash": row.result_hash, "code_version": row.code_version,
                        "attrs": {"cached_from": row.cached_from} if row.cached_from else {}})
    for r in artifacts:
        if task_key is None or r.task_key == task_key:
            made = view.tasks.get(r.task_key)
            out.append({"task_key": r.task_key, "attempt": r.attempt,
                        "direction": r.direction, "uri": r.uri,
                        "content_hash": r.content_hash,
                        "code_version": made.code_version if made else None,
                        "attrs": dict(r.attrs or {})})
    for a in approvals:
        if a["state"] != PENDING_APPROVAL and (task_key is None or a["task_key"] == task_key):
            made = view.tasks.get(a["task_key"])
            out.append({"task_key": a["task_key"], "attempt": a["attempt"],
                        "direction": "approval", "uri": f"approval:{a['digest']}",
                        "content_hash": a["digest"],
                        "code_version": made.code_version if made else None,
                        "attrs": {"action": a["action"], "decision": a["state"],
                                  "decided_by": a["decided_by"] or "",
                                  "reason": a["reason"] or ""}})
    for c in calls:     # model and tool calls: what an agent asked and did
        if task_key is None or c["task_key"] == task_key:
            made = view.tasks.get(c["task_key"])
            if "tool" in c:
                out.append({"task_key": c["task_key"], "attempt": c["attempt"],
                            "direction": "tool_call", "uri": f"tool:{c['tool']}",
                            "content_hash": c["result_hash"] or None,
                            "code_version": made.code_version if made else None,
                            "attrs": {"seq": str(c["seq"]), "outcome": c["outcome"],
                                      "arguments_digest": c["arguments_digest"],
                                      "approved_by": c["approved_by"]}})
            else:
                out.append({"task_key": c["task_key"], "attempt": c["attempt"],
                            "direction": "model_call",
                            "uri": f"model:{c['provider']}/{c['model']}",
                            "content_hash": c["response_hash"] or None,
                            "code_version": made.code_version if made else None,
                            "attrs": {"seq": str(c["seq"]), "request": c["request_hash"],
                                      "tokens": str(c["input_tokens"] + c["output_tokens"]),
                                      "cost": str(c["cost"]), "key": c["key_alias"]}})
    return out


def ancestry(view: RunView, task_key: str) -> list[str]:
    """``task_key`` and every task it read from, transitively (nearest first)."""
    children: dict[str, list[str]] = {}
    for row in view.tasks.values():
        if row.position is not None:
            children.setdefault(row.node, []).append(row.key)
    keys = [task_key]
    seen, stack = {task_key}, [task_key]
    while stack:
        for up in view.tasks[stack.pop()].upstream:
            for k in ([up] if up in view.tasks else children.get(up, [])):
                if k not in seen:
                    seen.add(k)
                    keys.append(k)
                    stack.append(k)
    return keys


def lineage_of(view: RunView, rows: Iterable[dict[str, Any]],
               task_key: str) -> list[dict[str, Any]]:
    """The lineage rows of ``task_key`` and its ancestry, the task's own first
    (``pipeline lineage --task KEY``)."""
    order = {k: i for i, k in enumerate(ancestry(view, task_key))}
    return sorted((r for r in rows if r["task_key"] in order),
                  key=lambda r: order[r["task_key"]])


def failed_like(state: str) -> bool:
    """True for failed, cancelled and upstream_failed."""
    return state in FAILED_LIKE


def counts_text(counts: Mapping[str, int]) -> str:
    """``3 failed, 7 succeeded``: counts by state, sorted by state name."""
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def output_to_json(value: Any) -> Any:
    """A pipeline's return value with references as ``{"$task": key}`` / ``{"$map": key}``."""
    t = type(value)
    if t is TaskRef:
        return {"$task": value.key}
    if t is MapRef:
        return {"$map": value.key}
    if t is list or t is tuple:
        return [output_to_json(v) for v in value]
    if t is dict:
        return {str(k): output_to_json(v) for k, v in value.items()}
    if value is None or t in (str, int, float, bool):
        return value
    return repr(value)


def output_from_json(doc: Any) -> Any:
    """The inverse of :func:`output_to_json` (tuples come back as lists)."""
    if isinstance(doc, dict):
        if set(doc) == {"$task"}:
            return TaskRef(doc["$task"])
        if set(doc) == {"$map"}:
            return MapRef(doc["$map"])
        return {k: output_from_json(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [output_from_json(v) for v in doc]
    return doc
