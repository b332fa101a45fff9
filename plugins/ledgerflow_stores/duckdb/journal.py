"""Journal segments: the per-run, per-token files every group commit is appended to.

``<ledger>.d/journals/<run>.<token>.jsonl``: one line per group commit, a
JSON array of records (:mod:`ledgerflow.records`). The append of a line is
the durability point of a commit (``sync="full"`` adds an ``fsync``); a torn
last line (a crash mid-``write``) is never read. A takeover starts a new
segment with a higher token, so bytes a superseded driver still writes go to
a segment no reader applies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from ledgerflow.records import AnyRecord, Record, decode_line, encode_line


class Journals:
    """The journal folder of one ledger, and the segments this process appends to."""

    def __init__(self, folder: Path, sync: str = "normal") -> None:
        self.folder = folder
        self.sync = sync
        self._open: dict[str, tuple[int, int]] = {}      # run_id -> (token, fd)

    def path(self, run_id: str, token: int) -> Path:
        return self.folder / f"{run_id}.{token}.jsonl"

    def segments(self, run_id: str) -> list[tuple[int, Path]]:
        """``(token, path)`` of every segment of ``run_id``, oldest first."""
        out = []
        if self.folder.is_dir():
            for f in self.folder.glob(f"{run_id}.*.jsonl"):
                try:
                    out.append((int(f.name[len(run_id) + 1:-6]), f))
                except ValueError:
                    continue
        return sorted(out)

    def runs(self) -> set[str]:
        """Run ids that have a journal in the folder."""
        if not self.folder.is_dir():
            return set()
        return {f.name.rsplit(".", 2)[0] for f in self.folder.glob("*.jsonl")}

    # -- writing -------------------------------------------------------------------------
    def start(self, run_id: str, token: int) -> None:
        """Open (create) the segment this process appends ``run_id``'s commits to."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(run_id, token), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._open[run_id] = (token, fd)

    def token(self, run_id: str) -> int | None:
        """The token of the segment this process writes for ``run_id`` (None: none)."""
        entry = self._open.get(run_id)
        return None if entry is None else entry[0]

    def append(self, run_id: str, records: Sequence[Record]) -> int:
        """Write one group commit as one line; return its size in bytes."""
        data = encode_line(records)
        fd = self._open[run_id][1]
        os.write(fd, data)
        if self.sync == "full":
            os.fsync(fd)
        return len(data)

    def stop(self, run_id: str) -> bool:
        """Close ``run_id``'s segment; False if this process had none open."""
        entry = self._open.pop(run_id, None)
        if entry is None:
            return False
        os.close(entry[1])     # each commit is already as durable as ``sync`` asks
        return True

    def open_runs(self) -> list[tuple[str, int]]:
        return [(run_id, token) for run_id, (token, _) in self._open.items()]

    def delete(self, run_id: str) -> None:
        for _, seg in self.segments(run_id):
            seg.unlink(missing_ok=True)


def iter_lines(path: Path, start: int, limit: int) -> Iterator[tuple[bytes, int]]:
    """Yield runs of complete lines (about ``limit`` bytes each, 0: all; without the
    last newline) and the offset after them; a torn last line is left out."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(start)
        offset = start
        pending = b""
        while True:
            data = pending + fh.read(max(limit - len(pending), 1 << 16) if limit else -1)
            cut = data.rfind(b"\n")
            if cut < 0:
                more = fh.read(1 << 22)     # one line longer than the batch: read it all
                if not more:
                    return
                pending = data + more
                continue
            pending = data[cut + 1:]
            offset += cut + 1
            yield data[:cut], offset
            del data


def read_records(path: Path, start: int) -> tuple[list[AnyRecord], int]:
    """The records of the complete lines of ``path`` from byte ``start``, and the end."""
    records: list[AnyRecord] = []
    end = start
    for body, offset in iter_lines(path, start, 0):
        for line in body.split(b"\n"):
            if line:
                records.extend(decode_line(line))
        end = offset
    return records, end
