"""The journal-append micro-benchmark: encoding and appending one trivial task's records.

The records are those of the release being measured (tuple records in the
first release, then the format's own kinds), so a baseline from an earlier
commit measures the same work in its own format.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def first_release() -> bool:
    """True when measuring the first release (tuple records), for before/after runs."""
    import ledgerflow.store
    return hasattr(ledgerflow.store, "RECORD_KINDS")


def _task_records(key: str, seq: int, now: float) -> list[Any]:
    """The records one trivial task writes, in this release's format."""
    if first_release():     # plain tuples
        return [("T", key, "noop", key, None, None, [], "v1", now),
                ("E", seq, key, 0, None, "pending", "", now),
                ("E", seq + 1, key, 0, "pending", "ready", "", now),
                ("E", seq + 2, key, 1, "ready", "running", "attempt 1", now),
                ("A", key, 1, "ok", now, now, "", "", ""),
                ("R", key, 1, "f" * 32, "h" * 32, "json", "1", None, 1, None),
                ("E", seq + 3, key, 1, "running", "succeeded", "", now)]
    from ledgerflow.records import (
        FORMAT_VERSION,
        AttemptEnded,
        ResultRecorded,
        TaskCreated,
        Transition,
    )
    if FORMAT_VERSION >= 3:     # outcome records: created + pending, ready + running, ok
        from ledgerflow.records import Succeeded
        return [TaskCreated(key, "noop", key, None, None, [], "v1", now, seq),
                Transition(seq + 1, key, 0, "pending", "ready", "", now, "running", 1,
                           "attempt 1", now),
                Succeeded(seq + 3, key, 1, now, now, "f" * 32, "h" * 32, "json", "1", None, 1,
                          now)]
    return [TaskCreated(key, "noop", key, None, None, [], "v1", now),
            Transition(seq, key, 0, None, "pending", "", now),
            Transition(seq + 1, key, 0, "pending", "ready", "", now),
            Transition(seq + 2, key, 1, "ready", "running", "attempt 1", now),
            AttemptEnded(key, 1, "ok", now, now, "", "", ""),
            ResultRecorded(key, 1, "f" * 32, "h" * 32, "json", "1", None, 1, None),
            Transition(seq + 3, key, 1, "running", "succeeded", "", now)]


def journal_append_us(folder: Path, n: int = 10_000) -> float:
    """Encoding and appending one task's records to the DuckDB store's journal, per task
    (one commit per task: the worst case, what an inline chain does)."""
    from ledgerflow.config import Settings
    from ledgerflow.plugins import get_plugin_manager
    st = get_plugin_manager().hook.ledgerflow_make_store(
        name="duckdb", settings=Settings(store=str(folder / "append.duckdb")))
    now = time.time()
    head: list[Any]
    if first_release():
        head = [("D", "r", "p", None, "{}", now, "{}"), ("S", "running", "", now)]
    else:
        from ledgerflow.records import RunDefined, RunStateChanged
        head = [RunDefined("r", "p", None, "{}", now, "{}"), RunStateChanged("running", "", now)]
    lease = st.create_run("r", head)
    batches = [_task_records(f"noop-{i}", 4 * i + 1, now) for i in range(n)]
    t = time.perf_counter()
    for records in batches:
        st.append(lease, records)
    dt = time.perf_counter() - t
    st.release(lease)
    return dt / n * 1e6
