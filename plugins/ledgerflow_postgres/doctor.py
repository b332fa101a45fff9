"""What is wrong with a PostgreSQL ledger (``pipeline doctor``), and its repair.

The commits are the source of truth and are never changed: the repair
rebuilds each run's rows from all of its commits, in place, and is refused
while any run is driven.
"""

from __future__ import annotations

from typing import Any

from ledgerflow.blobs import Blobs
from ledgerflow.errors import StoreError
from ledgerflow.states import RUN_ACTIVE

from . import schema
from .connection import Connections
from .fold import Folder

_ACTIVE = [s.value for s in RUN_ACTIVE]


def examine(conns: Connections, blobs: Blobs) -> list[dict[str, Any]]:
    """The findings, ``{"problem", "what", "fix"}`` each, the first one the summary."""
    shown = conns.db.shown

    def read(con: Any) -> list[dict[str, Any]]:
        version = schema.check(con, shown)
        n = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        out = [{"problem": False, "what": f"postgres ledger {shown}: schema "
                f"version {version}, {n} run(s)", "fix": ""}]
        for run_id, _ in Folder.dead_tails(con):
            out.append({"problem": True, "what": f"run {run_id}: its driver is gone "
                        "and left commits not folded into the tables (reads include "
                        "them; SQL on the tables does not)",
                        "fix": f"pipeline fold --store ...  (or: pipeline resume {run_id})"})
        for run_id, state in con.execute(
                "SELECT r.run_id, r.state FROM runs r JOIN leases l USING (run_id) "
                "WHERE r.state = ANY(%s) AND l.expires_at <= now() "
                "ORDER BY r.created_at", [_ACTIVE]).fetchall():
            out.append({"problem": False, "what": f"run {run_id} is {state} with no "
                        "driver (resumable)", "fix": f"pipeline resume {run_id}"})
        missing = [(r, k, u) for r, k, u in con.execute(
            "SELECT run_id, task_key, result_uri FROM tasks WHERE state = 'succeeded' "
            "AND result_uri IS NOT NULL").fetchall() if not blobs.exists(u)]
        for run_id, key, uri in missing[:20]:
            out.append({"problem": True, "what": f"run {run_id} task {key}: result file "
                        f"{blobs.path(uri)} is missing",
                        "fix": "set LEDGERFLOW_BLOB_DIR to the shared result directory, "
                        f"or: pipeline resume {run_id} (the task runs again)"})
        return out
    return conns.read(read, "checking the ledger")


def rebuild(conns: Connections, folder: Folder) -> tuple[str, list[str]]:
    """Rebuild every run's rows from its commits; ("", what was done). Nothing is copied
    aside: the commits are not changed."""
    def runs(con: Any) -> list[tuple[str, int, bool]]:
        return [(r, int(t), bool(live)) for r, t, live in con.execute(
            "SELECT run_id, token, expires_at > now() FROM leases ORDER BY run_id")]
    all_runs = conns.read(runs, "reading the ledger")
    live = [r for r, _, alive in all_runs if alive]
    if live:
        raise StoreError(f"run {live[0]} is being driven; repair rewrites every run's rows",
                         hint="wait for the runs to end (pipeline runs), then repair")
    notes: list[str] = []
    for run_id, token, _ in all_runs:
        folder.rebuild(run_id, token)
        notes.append(f"run {run_id}: rebuilt from its commits")
    return "", notes
