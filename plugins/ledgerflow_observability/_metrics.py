"""The Prometheus metrics' definitions and their counting from committed records (stdlib).

Counting is a few dict updates per record, in the driver; the text
exposition and the textfile merge are in
:mod:`ledgerflow_observability._prometheus` (prometheus-client).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from typing import Final

from ledgerflow.records import Notice, Record, RunStateChanged, Transition
from ledgerflow.store import RunStore

from ._runs import TRACKERS
from .genai import usage_rows

Labels = tuple[str, ...]

#: Histogram bucket upper bounds, in seconds (+Inf is implied).
BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  300.0, 900.0, 3600.0)

#: name (without ``_total``) -> (help, label names)
COUNTERS: Final[dict[str, tuple[str, Labels]]] = {
    "ledgerflow_task_transitions": (
        "Task state transitions, by the state entered.", ("pipeline", "state")),
    "ledgerflow_task_retries": (
        "Attempts that ended badly and were scheduled again.", ("pipeline", "task")),
    "ledgerflow_cache_hits": (
        "Tasks whose result was reused from an earlier run.", ("pipeline", "task")),
    "ledgerflow_results_rejected": (
        "Results rejected, not applied: late (after a timeout) or duplicate.",
        ("pipeline", "kind")),
    "ledgerflow_runs_finished": (
        "Runs that ended, by their final state.", ("pipeline", "state")),
    "ledgerflow_model_calls": (
        "Model calls reported by tasks.", ("pipeline", "provider", "model")),
    "ledgerflow_model_tokens": (
        "Model tokens reported by tasks (type: input or output).",
        ("pipeline", "provider", "model", "type")),
    "ledgerflow_model_cost_usd": (
        "Model cost in US dollars reported by tasks.", ("pipeline", "provider", "model")),
}

#: name -> (help, label names); observed in seconds
HISTOGRAMS: Final[dict[str, tuple[str, Labels]]] = {
    "ledgerflow_attempt_duration_seconds": (
        "Attempt time: from the start of the task's code (else its running commit) to its "
        "end.", ("pipeline", "task", "outcome")),
    "ledgerflow_queue_wait_seconds": (
        "From a task becoming ready to the start of its code (slot wait and hand-off).",
        ("pipeline", "task")),
}

_REJECTED = {"late_result_rejected": "late", "duplicate_result_rejected": "duplicate"}
_TERMINAL_RUN = frozenset({"succeeded", "failed", "cancelled"})


class Metrics:
    """Counters and histograms not yet written out (the deltas of this process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: dict[str, dict[Labels, float]] = {n: {} for n in COUNTERS}
        #: name -> labels -> [count per bucket (last: +Inf)..., sum]
        self.hists: dict[str, dict[Labels, list[float]]] = {n: {} for n in HISTOGRAMS}

    def inc(self, name: str, labels: Labels, by: float = 1.0) -> None:
        series = self.counters[name]
        series[labels] = series.get(labels, 0.0) + by

    def observe(self, name: str, labels: Labels, value: float) -> None:
        series = self.hists[name]
        h = series.get(labels)
        if h is None:
            h = series[labels] = [0.0] * (len(BUCKETS) + 2)
        h[bisect.bisect_left(BUCKETS, value)] += 1
        h[-1] += value

    def take(self) -> tuple[dict[str, dict[Labels, float]], dict[str, dict[Labels, list[float]]]]:
        """The deltas so far, and start new ones."""
        with self.lock:
            out = self.counters, self.hists
            self.counters = {n: {} for n in COUNTERS}
            self.hists = {n: {} for n in HISTOGRAMS}
        return out

    def empty(self) -> bool:
        return not any(self.counters.values()) and not any(self.hists.values())


class Counting:
    """Counts the committed records of the runs this process drives."""

    def __init__(self) -> None:
        self.metrics = Metrics()

    def committed(self, run_id: str, records: Sequence[Record], store: RunStore) -> None:
        commit = TRACKERS.commit(self, run_id, records, store)
        tracker, ended = commit.tracker, commit.ended
        p = tracker.pipeline
        m = self.metrics
        tasks = tracker.tasks
        with m.lock:
            for rec in records:
                if isinstance(rec, Transition):
                    to = rec.to_state
                    m.inc("ledgerflow_task_transitions", (p, to))
                    if to == "retry_wait":
                        m.inc("ledgerflow_task_retries", (p, tasks[rec.task_key].task_name))
                    elif to == "succeeded" and rec.from_state == "ready":
                        m.inc("ledgerflow_cache_hits", (p, tasks[rec.task_key].task_name))
                elif isinstance(rec, Notice):
                    kind = _REJECTED.get(rec.kind)
                    if kind is not None:
                        m.inc("ledgerflow_results_rejected", (p, kind))
                elif isinstance(rec, RunStateChanged) and rec.state in _TERMINAL_RUN:
                    m.inc("ledgerflow_runs_finished", (p, rec.state))
            for end in ended:
                name = end.task.task_name
                begun = end.started_at or end.running_at
                if begun:
                    m.observe("ledgerflow_attempt_duration_seconds", (p, name, end.outcome),
                              max(0.0, end.ended_at - begun))
                    if end.ready_at is not None:
                        m.observe("ledgerflow_queue_wait_seconds", (p, name),
                                  max(0.0, begun - end.ready_at))
                for row in usage_rows(end.artifacts):
                    who = (p, row.get("provider", ""), row.get("model", ""))
                    m.inc("ledgerflow_model_calls", who, float(row.get("calls", 0)))
                    m.inc("ledgerflow_model_tokens", (*who, "input"),
                          float(row.get("input_tokens", 0)))
                    m.inc("ledgerflow_model_tokens", (*who, "output"),
                          float(row.get("output_tokens", 0)))
                    if "cost_usd" in row:
                        m.inc("ledgerflow_model_cost_usd", who, float(row["cost_usd"]))

    def finish(self, run_id: str) -> None:
        TRACKERS.finish(self, run_id)
