"""Journal segments: the per-run, per-token files every group commit is appended to.

``<ledger>.d/journals/<run>.<token>.jsonl``: one line per group commit, a
JSON array of records (:mod:`ledgerflow.records`) followed by a tab and the
line's CRC-32 (lines of the first release carry none). The append of a line
is the durability point of a commit (``sync="full"`` adds an ``fsync``); a
torn last line (a crash mid-``write``) is never read. A takeover starts a new
segment with a higher token, so bytes a superseded driver still writes go to
a segment no reader applies.

The journals are the source of truth: once a finished run is folded, its
segments are archived as ``.jsonl.gz`` (``pipeline repair`` rebuilds the
tables from them). A line that fails its checksum or does not decode is
*damage*: readers use a segment up to it and report where it is. So is a line
without a checksum that holds an approval decision: the first release wrote
no decisions, so that line was not written by ledgerflow (a decision counts
only as the store records it, :mod:`.decisions`).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import logging
import os
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ledgerflow import private
from ledgerflow.records import AnyRecord, ApprovalDecided, Record, decode_line, encode_line

from .threads import RunThreads

log = logging.getLogger("ledgerflow")
#: (journal folder, run_id) -> the thread archiving the run's segments, for every
#: ledger of this process (see :meth:`Journals.archive_soon`)
_ARCHIVING = RunThreads("archive")
_TAB = b"\t"
#: why a line without a checksum that holds an approval decision is damage
UNCHECKED_DECISION = "an approval decision without its checksum (not written by ledgerflow)"


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a journal segment stops being readable, and why."""

    path: Path
    offset: int
    reason: str

    def describe(self) -> str:
        return f"journal {self.path.name} is damaged at byte {self.offset}: {self.reason}"


def frame(records: Sequence[Record]) -> bytes:
    """One journal line: the records' JSON, a tab, its CRC-32 in hex, a newline."""
    body = encode_line(records)[:-1]
    return body + b"\t%08x\n" % zlib.crc32(body)


def unframe(line: bytes) -> bytes | None:
    """The JSON of one line (without newline), or None if its checksum fails.

    A line without a checksum (format 1) is returned as it is.
    """
    cut = line.rfind(_TAB)
    if cut < 0 or len(line) - cut != 9:
        return line
    body = line[:cut]
    try:
        ok = int(line[cut + 1:], 16) == zlib.crc32(body)
    except ValueError:
        return None
    return body if ok else None


def unchecked_decision(line: bytes) -> bool:
    """True if ``line`` (as written) carries no checksum but holds an approval decision."""
    cut = line.rfind(_TAB)
    if (cut >= 0 and len(line) - cut == 9) or b'"Q"' not in line:
        return False
    try:
        return any(isinstance(r, ApprovalDecided) for r in decode_line(line))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


def check_line(line: bytes) -> tuple[bytes | None, list[AnyRecord], str]:
    """Decode one line: (its JSON, its records, "") or (None, [], why it is damaged)."""
    body = unframe(line)
    if body is None:
        return None, [], "checksum mismatch"
    try:
        return body, decode_line(body), ""
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, [], f"not a journal line ({exc})"


class Journals:
    """The journal folder of one ledger, and the segments this process appends to."""

    def __init__(self, folder: Path, sync: str = "normal") -> None:
        self.folder = folder
        self.sync = sync
        self._open: dict[str, tuple[int, int]] = {}      # run_id -> (token, fd)

    def path(self, run_id: str, token: int) -> Path:
        return self.folder / f"{run_id}.{token}.jsonl"

    def segments(self, run_id: str) -> list[tuple[int, Path]]:
        """``(token, path)`` of the live (not archived) segments of ``run_id``."""
        if _ARCHIVING:
            self.settle(run_id)
        return self._glob(f"{run_id}.*.jsonl", run_id)

    def archived(self, run_id: str) -> list[tuple[int, Path]]:
        """``(token, path)`` of the archived segments of ``run_id``."""
        if _ARCHIVING:
            self.settle(run_id)
        return self._glob(f"{run_id}.*.jsonl.gz", run_id)

    def _glob(self, pattern: str, run_id: str) -> list[tuple[int, Path]]:
        out = []
        if self.folder.is_dir():
            for f in self.folder.glob(pattern):
                token = f.name[len(run_id) + 1:].split(".", 1)[0]
                if token.isdigit():
                    out.append((int(token), f))
        return sorted(out)

    def every_segment(self, run_id: str) -> list[tuple[int, Path]]:
        """``(token, path)`` of every segment of ``run_id``, live or archived; a token
        found as both (another process archiving it right now) is read from its
        archive, which is complete once it is there (the live file goes next)."""
        found = dict(self.segments(run_id))
        found.update(self.archived(run_id))
        return sorted(found.items())

    def newest_token(self, run_id: str) -> int:
        """The highest token of ``run_id``'s segments, archived ones included (0: none)."""
        return max((t for t, _ in self.every_segment(run_id)), default=0)

    def runs(self) -> set[str]:
        """Run ids that have a live journal segment (not those this process is archiving:
        folded and finished, they are read from the tables)."""
        if not self.folder.is_dir():
            return set()
        live = {f.name.rsplit(".", 2)[0] for f in self.folder.glob("*.jsonl")}
        return live - _ARCHIVING.running(str(self.folder))

    def all_runs(self) -> set[str]:
        """Run ids with any segment, archived ones included."""
        if not self.folder.is_dir():
            return set()
        return {f.name.split(".", 1)[0] for f in self.folder.iterdir()
                if f.name.endswith((".jsonl", ".jsonl.gz"))}

    # -- writing -------------------------------------------------------------------------
    def start(self, run_id: str, token: int) -> int:
        """Open (create) the segment this process appends ``run_id``'s commits to.

        The driver holds an exclusive ``flock`` on it while it drives: a second
        sign of life beside the lease file (:meth:`held`).
        """
        private.make_dirs(self.folder)
        fd = private.open_file(self.path(run_id, token), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        self._open[run_id] = (token, fd)
        return fd

    def held(self, run_id: str) -> bool:
        """True if a live process holds the lock of one of ``run_id``'s segments."""
        for _, path in self.segments(run_id):
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError:
                continue
            finally:
                os.close(fd)
        return False

    def token(self, run_id: str) -> int | None:
        """The token of the segment this process writes for ``run_id`` (None: none)."""
        entry = self._open.get(run_id)
        return None if entry is None else entry[0]

    def append(self, run_id: str, records: Sequence[Record]) -> int:
        """Write one group commit as one line; return its size in bytes."""
        data = frame(records)
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

    def archive_soon(self, run_id: str, upto: int | None = None) -> None:
        """:meth:`archive` on a thread of its own, off the path of the run's release
        (a 10,000-task journal: ~20 ms; zlib releases the GIL, so it overlaps what the
        process does next). This process's listings of the run wait for it
        (:meth:`settle`), and so does the interpreter's exit; a process killed first
        leaves the journal live and folded, and the next fold archives it."""
        def work() -> None:
            try:
                self.archive(run_id, upto)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) and not self.folder.exists():
                    log.debug("run %s: its journal folder %s is gone, nothing to archive",
                              run_id, self.folder)
                    return
                log.warning("could not archive the journal of run %s (%s); the next fold "
                            "archives it", run_id, exc)
        _ARCHIVING.start(str(self.folder), run_id, work)

    def settle(self, run_id: str | None = None) -> None:
        """Wait for the archiving of ``run_id`` (None: of every run) that this process
        began in this folder."""
        _ARCHIVING.wait(str(self.folder), run_id)

    def archive(self, run_id: str, upto: int | None = None) -> None:
        """Compress the live segments of a finished, folded run (atomically each); with
        ``upto``, only those of drivers up to that token (a resume that took the run over
        meanwhile writes a segment of its own, which stays live).

        Level 1: about 5.5 times smaller (level 6: 6.3), in a third of the time (every
        finished run pays it, on :meth:`archive_soon`'s thread)."""
        for token, seg in self._glob(f"{run_id}.*.jsonl", run_id):
            if upto is not None and token > upto:
                continue
            gz = seg.with_name(seg.name + ".gz")
            tmp = seg.with_name(seg.name + f".gz.{os.getpid()}.tmp")
            try:
                src = open(seg, "rb")
            except FileNotFoundError:
                continue        # removed meanwhile (its folder on the way out, say)
            try:
                out = os.fdopen(private.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                "wb")
            except BaseException:
                src.close()
                raise
            with src, out, gzip.GzipFile(
                    filename="", mode="wb", compresslevel=1, fileobj=out, mtime=0) as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.replace(tmp, gz)
            seg.unlink(missing_ok=True)


def iter_lines(path: Path, start: int, limit: int) -> Iterator[tuple[bytes, int]]:
    """Yield runs of complete lines (about ``limit`` bytes each, 0: all; without the
    last newline) and the offset after them; a torn last line is left out."""
    try:
        fh = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
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


def read_records(path: Path, start: int) -> tuple[list[AnyRecord], int, Damage | None]:
    """The records of the complete lines of ``path`` from byte ``start``.

    Returns the records, the offset after the last good line, and the damage
    that stopped the reading (None: the segment is whole).
    """
    records: list[AnyRecord] = []
    end = start
    for body, offset in iter_lines(path, start, 0):
        pos = offset - len(body) - 1
        for line in body.split(b"\n"):
            if line:
                _, recs, why = check_line(line)
                if not why and unchecked_decision(line):
                    why = UNCHECKED_DECISION
                if why:
                    return records, pos, Damage(path, pos, why)
                records.extend(recs)
            pos += len(line) + 1
            end = pos
        end = offset
    return records, end, None


class TailReads:
    """:func:`read_records`, read once per segment, offset and size inside a thread's read
    block (:meth:`block`, the store's ``reading``): a command that reads a run, its
    approvals and its notices decodes a live run's tail once, not once a read. A segment
    that grew meanwhile is read again; outside a block every call reads."""

    def __init__(self) -> None:
        self._blocks: dict[int, dict[tuple[str, int, int], tuple[list[AnyRecord],
                                                                 Damage | None]]] = {}

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        me = threading.get_ident()
        if me in self._blocks:      # nested: the outer block keeps what is read
            yield
            return
        self._blocks[me] = {}
        try:
            yield
        finally:
            del self._blocks[me]

    def read(self, path: Path, start: int) -> tuple[list[AnyRecord], Damage | None]:
        """The records of ``path`` from byte ``start`` and the damage that stopped them
        (the list is shared within a block: extend another list with it)."""
        memo = self._blocks.get(threading.get_ident())
        if memo is None:
            records, _, bad = read_records(path, start)
            return records, bad
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        key = (str(path), start, size)
        hit = memo.get(key)
        if hit is None:
            records, _, bad = read_records(path, start)
            hit = memo[key] = (records, bad)
        return hit
