"""Approval decisions from any process: one checked file per request, the first one wins.

``<ledger>.d/runs/<run>/decisions/<digest>.json`` holds one line: the decision's
JSON, a tab and a CRC-32 (in hex) of the run id, the digest and that JSON, so
the line checks only for the request it was written for. It is written whole
to a private temporary file and then linked to its name (``link`` fails if the
name exists), so of two processes deciding the same request at once exactly one
succeeds, and a reader never sees half a decision. The driver (or whoever next
drives the run) copies decisions into the journal as ``ApprovalDecided`` records.

A file that does not check (written by hand, copied from another request, cut,
or left by a release before the check) is *damage*, never a decision: readers
skip it, ``pipeline doctor`` names it (:meth:`Decisions.damaged`) and a decision
on its request is refused until it is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from pathlib import Path
from typing import Any

from ledgerflow import private
from ledgerflow.errors import ApprovalConflictError


def _crc(run_id: str, digest: str, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(f"{run_id}\n{digest}\n".encode()))


def framed(run_id: str, doc: dict[str, Any]) -> bytes:
    """The bytes of ``doc``'s decision file: its JSON, a tab, the bound CRC-32."""
    body = json.dumps(doc, sort_keys=True).encode()
    return body + b"\t%08x\n" % _crc(run_id, str(doc["digest"]), body)


def check(run_id: str, path: Path, data: bytes) -> tuple[dict[str, Any] | None, str]:
    """``(the decision, "")`` if ``data`` is a decision file written for ``path``'s
    request of ``run_id``, else ``(None, why not)``."""
    digest = path.name.removesuffix(".json")
    line = data[:-1] if data.endswith(b"\n") else data
    cut = line.rfind(b"\t")
    if cut < 0 or len(line) - cut != 9:
        return None, "no checksum (not written by ledgerflow's decide)"
    body = line[:cut]
    try:
        ok = int(line[cut + 1:], 16) == _crc(run_id, digest, body)
    except ValueError:
        ok = False
    if not ok:
        return None, "checksum mismatch (changed by hand, or another request's file)"
    try:
        doc = json.loads(body)
    except ValueError:
        return None, "not JSON"
    if not isinstance(doc, dict) or doc.get("digest") != digest or "decision" not in doc:
        return None, "not a decision of this request"
    return doc, ""


class Decisions:
    """The decision files of one ledger."""

    def __init__(self, runs: Path) -> None:
        self.runs = runs

    def folder(self, run_id: str) -> Path:
        return self.runs / run_id / "decisions"

    def write(self, run_id: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Record ``doc`` (task_key, digest, decision, decided_by, reason, decided_at and
        any other keys, kept as they are).

        Raises:
            ApprovalConflictError: the request was decided already, or a damaged file
                holds its place.
        """
        folder = self.folder(run_id)
        private.make_dirs(folder)
        path = folder / f"{doc['digest']}.json"
        tmp = folder / f".{doc['digest']}.{os.getpid()}.tmp"
        fd = private.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(framed(run_id, doc))
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise self._conflict(run_id, path, doc) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return doc

    def _conflict(self, run_id: str, path: Path, doc: dict[str, Any]) -> ApprovalConflictError:
        other, why = self.read_one(run_id, path)
        if other is None:
            return ApprovalConflictError(
                f"the decision file {path} of request {doc['digest'][:12]} is damaged "
                f"({why}); it is no decision, but it holds the request's place",
                hint=f"remove it (pipeline doctor lists it), then decide again; see the "
                f"request with: pipeline approvals {run_id}")
        return ApprovalConflictError(
            f"the request {doc['digest'][:12]} of {doc['task_key']} was already "
            f"{other.get('decision', 'decided')} by {other.get('decided_by', 'someone')}",
            hint=f"see it with: pipeline approvals {run_id}")

    @staticmethod
    def read_one(run_id: str, path: Path) -> tuple[dict[str, Any] | None, str]:
        """The decision in ``path``, or None and why it is none."""
        try:
            data = path.read_bytes()
        except OSError as exc:
            return None, f"cannot be read: {exc.strerror}"
        return check(run_id, path, data)

    def all(self, run_id: str) -> list[dict[str, Any]]:
        """The decisions of ``run_id`` whose files check, oldest first."""
        folder = self.folder(run_id)
        if not folder.is_dir():
            return []
        out = [d for f in sorted(folder.glob("*.json")) if (d := self.read_one(run_id, f)[0])]
        return sorted(out, key=lambda d: d.get("decided_at", 0))

    def damaged(self) -> list[tuple[str, Path, str]]:
        """``(run, file, why)`` of every decision file of the ledger that does not check."""
        out = []
        if self.runs.is_dir():
            for f in sorted(self.runs.glob("*/decisions/*.json")):
                run_id = f.parent.parent.name
                doc, why = self.read_one(run_id, f)
                if doc is None:
                    out.append((run_id, f, why))
        return out

