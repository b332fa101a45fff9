"""Approval decisions from any process: one file per request, the first one wins.

``<ledger>.d/runs/<run>/decisions/<digest>.json`` is created with ``O_EXCL``,
so of two processes deciding the same request at once exactly one succeeds;
the driver (or whoever next drives the run) copies decisions into the journal
as ``ApprovalDecided`` records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ledgerflow.errors import ApprovalConflictError


class Decisions:
    """The decision files of one ledger."""

    def __init__(self, runs: Path) -> None:
        self.runs = runs

    def folder(self, run_id: str) -> Path:
        return self.runs / run_id / "decisions"

    def write(self, run_id: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Record ``doc`` (task_key, digest, decision, decided_by, reason, decided_at).

        Raises:
            ApprovalConflictError: the request was decided already.
        """
        folder = self.folder(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{doc['digest']}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            other = self.read_one(path) or {}
            raise ApprovalConflictError(
                f"the request {doc['digest'][:12]} of {doc['task_key']} was already "
                f"{other.get('decision', 'decided')} by {other.get('decided_by', 'someone')}",
                hint=f"see it with: pipeline approvals {run_id}") from None
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc))
            fh.flush()
            os.fsync(fh.fileno())
        return doc

    @staticmethod
    def read_one(path: Path) -> dict[str, Any] | None:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None     # being written right now, or damaged: not a decision yet
        return doc if isinstance(doc, dict) and "decision" in doc else None

    def all(self, run_id: str) -> list[dict[str, Any]]:
        folder = self.folder(run_id)
        if not folder.is_dir():
            return []
        out = [d for f in sorted(folder.glob("*.json")) if (d := self.read_one(f))]
        return sorted(out, key=lambda d: d.get("decided_at", 0))
