"""The Prometheus gauges to alert on, read from the ledger: runs in progress, waiting approvals.

Counters are counted from commits and summed across drivers; a gauge is a
state, so it is read from the ledger each time the textfile is written and
each time the console answers ``/metrics`` (a run that waits for a decision
has no driver to update it). Series are labelled with the ledger they were
read from, so drivers of several ledgers can share one textfile. Stdlib only.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from ledgerflow.gates import waiting_requests
from ledgerflow.states import RUN_TERMINAL, RunState
from ledgerflow.store import RunStore

log = logging.getLogger("ledgerflow")

Labels = tuple[str, ...]
Gauges = dict[str, dict[Labels, float]]

#: name -> (help, label names)
GAUGES: Final[dict[str, tuple[str, Labels]]] = {
    "ledgerflow_runs_in_progress": (
        "Runs not finished, by state (submitted, running, waiting, cancelling), as the "
        "ledger says.", ("ledger", "pipeline", "state")),
    "ledgerflow_approvals_waiting": (
        "Approval requests waiting for a decision (deadline not passed), as the ledger says.",
        ("ledger", "pipeline")),
}

#: How many of the newest runs are read (older unfinished runs are not counted).
RUNS_READ: Final = 10_000

_TERMINAL = frozenset(s.value for s in RUN_TERMINAL)
IN_PROGRESS: Final = tuple(s.value for s in RunState if s.value not in _TERMINAL)


def ledger_label(store: RunStore) -> str:
    """The ``ledger`` label of a store: its location, else its kind."""
    return str(store.location or store.name)


def read(store: RunStore) -> Gauges:
    """The gauges of ``store`` now: every pipeline among its newest runs gets a series per
    in-progress state (0 included, so an alert resolves instead of going stale)."""
    ledger = ledger_label(store)
    runs: dict[Labels, float] = {}
    waiting: dict[Labels, float] = {}
    now = time.time()
    for view in store.list_runs(RUNS_READ):
        for state in IN_PROGRESS:
            runs.setdefault((ledger, view.pipeline, state), 0.0)
        key = (ledger, view.pipeline)
        waiting.setdefault(key, 0.0)
        if view.state in _TERMINAL:
            continue
        runs[(ledger, view.pipeline, view.state)] = runs.get(
            (ledger, view.pipeline, view.state), 0.0) + 1
        for r in waiting_requests(store.approvals(view.run_id)):
            if r.get("deadline") is None or r["deadline"] > now:
                waiting[key] += 1
    return {"ledgerflow_runs_in_progress": runs, "ledgerflow_approvals_waiting": waiting}


def replace(into: Gauges, fresh: Gauges, ledger: str) -> Gauges:
    """``into`` with the series of ``ledger`` replaced by ``fresh`` (in place)."""
    for name in GAUGES:
        series = into.setdefault(name, {})
        for labels in [k for k in series if k and k[0] == ledger]:
            del series[labels]
        series.update(fresh.get(name, {}))
    return into
