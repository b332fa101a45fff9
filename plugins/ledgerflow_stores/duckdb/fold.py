"""The fold: journal lines into the ledger's tables, set-based, in bounded batches.

:class:`Fold` reads each run's journal segments from the offset folded so
far, in batches of whole, verified lines (a damaged line stops the segment
and is recorded as damage), and hands each batch to :func:`.batch.insert`,
the set-based SQL twin of :func:`ledgerflow.projection.apply`. A batch and
its journal offset commit in one transaction, so a crash mid-fold resumes
from the last batch. :class:`BackgroundFold` folds while a run goes on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zlib import crc32

from ledgerflow.errors import ConfigError, StoreLockedError
from ledgerflow.records import Notice, Takeover

from .batch import insert
from .connection import instance_setting
from .engine import duckdb
from .journal import (
    UNCHECKED_DECISION,
    Damage,
    Journals,
    check_line,
    iter_lines,
    unchecked_decision,
    unframe,
)

log = logging.getLogger("ledgerflow")



@dataclass(frozen=True, slots=True)
class FoldPolicy:
    """How much a fold does at once and how it shares the file."""

    #: Journal bytes per batch (one transaction).
    batch_bytes: int = 8 << 20
    #: Journal bytes folded on one connection before it is closed and the file left free.
    bite_bytes: int = 8 << 20
    #: Journal bytes written that wake the background fold.
    wake_bytes: int = 1 << 20
    #: Seconds between background folds when less than ``wake_bytes`` was written.
    interval: float = 5.0
    #: DuckDB's memory limit during a fold (a batch that needs more is retried without).
    memory_limit: str = "128MB"
    #: After each bite the file is left free for this fraction of the bite's time.
    share: float = 1 / 3
    #: Fold the rest when a driver releases its run (False: leave it to the next
    #: writer or ``pipeline fold``, as after a crash; for drivers that must exit fast).
    fold_at_release: bool = True
    #: Do that fold on a thread of this process, after the release returns (see
    #: :mod:`.behind`); False (``LEDGERFLOW_FOLD_BEHIND=0``): before it returns.
    behind: bool = True
    #: Seconds into a drive before the background fold first runs (None: 1 s, or
    #: ``interval`` if shorter). A shorter drive folds once, at release: on two cores
    #: folding beside the driver cost a 10,000-task chain ~20% more time than that.
    start_after: float | None = None

    @property
    def first_fold(self) -> float:
        """Seconds into a drive before the background fold first runs."""
        return min(1.0, self.interval) if self.start_after is None else self.start_after

    @classmethod
    def from_env(cls) -> FoldPolicy:
        """The defaults, with ``LEDGERFLOW_FOLD_INTERVAL`` (seconds),
        ``LEDGERFLOW_FOLD_WAKE_BYTES`` (journal bytes that wake the background fold) and
        ``LEDGERFLOW_FOLD_START_AFTER`` (seconds into a drive before it first runs) and
        ``LEDGERFLOW_FOLD_BEHIND`` (``0``: a release folds before it returns)."""
        import os
        kw: dict[str, Any] = {}
        behind = os.environ.get("LEDGERFLOW_FOLD_BEHIND", "").strip().lower()
        if behind:
            if behind not in ("0", "1", "false", "true", "no", "yes"):
                raise ConfigError(f"LEDGERFLOW_FOLD_BEHIND must be 0 or 1, given: {behind!r}",
                                  hint="unset LEDGERFLOW_FOLD_BEHIND or set it to 0 or 1")
            kw["behind"] = behind in ("1", "true", "yes")
        for name, key, kind in (("LEDGERFLOW_FOLD_INTERVAL", "interval", float),
                                ("LEDGERFLOW_FOLD_WAKE_BYTES", "wake_bytes", int),
                                ("LEDGERFLOW_FOLD_START_AFTER", "start_after", float)):
            raw = os.environ.get(name)
            if raw:
                try:
                    kw[key] = kind(raw)
                except ValueError:
                    raise ConfigError(f"{name} must be a number, given: {raw!r}",
                                      hint=f"unset {name} or set it to a number") from None
        return cls(**kw)


class Fold:
    """Folds the journals of one ledger into its file (see the module docstring)."""

    def __init__(self, journals: Journals, scratch: Path, policy: FoldPolicy) -> None:
        self.journals = journals
        self.scratch = scratch
        self.policy = policy
        #: run -> the run state its last folded batch moved it to
        self.states: dict[str, str] = {}

    def run(self, con: Any, run_id: str, max_bytes: int | None = None, *,
            segs: list[tuple[int, Path]] | None = None,
            yield_to: Callable[[], bool] | None = None) -> bool:
        """Fold ``run_id``'s journal; with ``max_bytes``, stop after about that much.

        ``segs``: these segments (archived ones too, for a rebuild) instead of the
        live ones. ``yield_to``: stop after the batch in progress once it is true (a
        reader waits for the file). Returns True if journal was left unfolded
        because of ``max_bytes`` or ``yield_to``.
        """
        segs = self.journals.segments(run_id) if segs is None else segs
        if not segs:
            return False
        # without a limit DuckDB keeps ~1 KB a folded task cached (the limit costs
        # ~10% more time at 100k tasks); one DuckDB thread: a batch (8 MB at most) is
        # too small to gain from more, and a background fold leaves the other core to
        # the driver (10k tasks: -30 ms). Both are the instance's, and stay set for
        # the process's later reads (setting them again costs ~2 ms a fold)
        try:
            instance_setting(con, "memory_limit", self.policy.memory_limit)
        except duckdb.OutOfMemoryException:
            # the instance holds more than that now (another fold or read of this
            # process, of any ledger): this fold goes on under the limit it has
            log.info("fold of run %s: DuckDB holds more than %s now; folding under the "
                     "limit it has", run_id, self.policy.memory_limit)
        instance_setting(con, "threads", "1")
        try:
            return self._segments(con, run_id, segs, max_bytes, yield_to)
        except duckdb.OutOfMemoryException:
            # DuckDB cannot spill every operator: what needs more than the limit gets
            # it (each batch committed with its offset, so this continues, not redoes)
            log.info("fold of run %s needs more than %s; retrying without the limit",
                     run_id, self.policy.memory_limit)
            instance_setting(con, "memory_limit", None)
            return self._segments(con, run_id, self.journals.segments(run_id), max_bytes,
                                  yield_to)

    def _segments(self, con: Any, run_id: str, segs: list[tuple[int, Path]],
                  max_bytes: int | None, yield_to: Callable[[], bool] | None) -> bool:
        budget = max_bytes
        folded = dict(con.execute('SELECT token, "offset" FROM journal_folds WHERE run_id = ?',
                                  [run_id]).fetchall())
        damaged = {t for (t,) in con.execute(
            "SELECT token FROM journal_damage WHERE run_id = ?", [run_id]).fetchall()}
        row = con.execute("SELECT token FROM runs WHERE run_id = ?", [run_id]).fetchall()
        current = max([(row[0][0] or 0) if row else 0, *(t for t, _ in segs)])
        cuts = _takeover_cuts(segs)
        for token, path in segs:
            if token in damaged:
                continue        # used up to its damage; the rest is never applied
            start = folded.get(token, 0)
            cut = cuts.get(token)
            stale = token < current and (token in folded or cut is not None)
            for body, end in iter_lines(path, start, self.policy.batch_bytes):
                if cut is not None and start < cut:
                    # a rebuild: what the old driver wrote before the takeover counts
                    body, end, stale = _before(body, end, cut), min(end, cut), False
                damage = self._batch(con, run_id, token, stale, path, body, end,
                                     known=token in folded)
                folded[token] = end
                if damage:
                    break
                if budget is not None:
                    budget -= len(body)
                    if budget <= 0:
                        return True
                if yield_to is not None and yield_to():
                    return True
        return False

    def _batch(self, con: Any, run_id: str, token: int, stale: bool, path: Path,
               body: bytes, end: int, *, known: bool) -> Damage | None:
        """One batch of journal lines and its journal offset, in one transaction.

        Folds the lines up to any damage and records the damage (returned).
        ``known``: the segment has a row in ``journal_folds`` already.
        """
        clean, good_end, damage = _verified(path, body, end)
        state: str | None = None
        con.execute("BEGIN")
        try:
            if stale:   # what a superseded driver wrote after the takeover
                count = sum(len(json.loads(line)) for line in clean.split(b"\n") if line)
                n = stale_notice(token, count, path)
                con.execute("INSERT INTO notices VALUES (?, NULL, NULL, ?, ?, ?)",
                            [run_id, n.kind, n.message, n.ts])
            elif clean:
                state = insert(con, run_id, token, clean, self._scratch())
        except (duckdb.InvalidInputException, duckdb.ConversionException,
                duckdb.BinderException) as exc:
            con.execute("ROLLBACK")
            # lines without a checksum (the first release's) that DuckDB cannot read:
            # find the first bad one and fold what comes before it
            clean, good_end, damage = _decoded(path, body, end - len(body) - 1, str(exc))
            con.execute("BEGIN")
            try:
                if clean:
                    state = insert(con, run_id, token, clean, self._scratch())
            except BaseException:
                con.execute("ROLLBACK")
                raise
        except BaseException:
            con.execute("ROLLBACK")
            raise
        try:
            # (an UPDATE or a plain INSERT: INSERT OR REPLACE plans for ~1 ms more)
            if known:
                con.execute('UPDATE journal_folds SET "offset" = ? WHERE run_id = ? AND token = ?',
                            [good_end, run_id, token])
            else:
                con.execute("INSERT INTO journal_folds VALUES (?, ?, ?)",
                            [run_id, token, good_end])
            if damage is not None:
                con.execute("INSERT INTO journal_damage VALUES (?, ?, ?, ?, ?)",
                            [run_id, token, damage.offset, damage.reason, time.time()])
                log.warning("run %s: %s; the records after it are not applied",
                            run_id, damage.describe())
            con.execute("COMMIT")
            if state is not None:
                self.states[run_id] = state
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return damage

    def _scratch(self) -> Path:
        return self.scratch / f"fold-{os.getpid()}-{threading.get_ident()}.json"


def _takeover_cuts(segs: list[tuple[int, Path]]) -> dict[int, int]:
    """``{token: offset}``: where later segments say an earlier one ends (Takeover)."""
    cuts: dict[int, int] = {}
    for _, path in segs:
        for body, _end in iter_lines(path, 0, 4096):
            first = body.split(b"\n", 1)[0]
            _, recs, _why = check_line(first)
            for rec in recs:
                if isinstance(rec, Takeover):
                    cuts[rec.from_token] = rec.from_offset
            break
    return cuts


def _before(body: bytes, end: int, cut: int) -> bytes:
    """The complete lines of ``body`` (which ends at ``end``) that end at or before ``cut``."""
    start = end - len(body) - 1
    if cut >= end:
        return body
    keep = max(0, cut - start - 1)
    return body[:keep]


def _verified(path: Path, body: bytes, end: int) -> tuple[bytes, int, Damage | None]:
    """The JSON of ``body``'s lines up to the first that fails its checksum."""
    # the usual case, every line framed and intact, in as few Python steps a line as
    # possible (a background fold's Python work holds the GIL the driver wants back)
    lines = body.split(b"\n")
    try:
        if all(ln[-9:-8] == b"\t" and int(ln[-8:], 16) == crc32(ln[:-9])
               for ln in lines if ln):
            return b"\n".join([ln[:-9] for ln in lines if ln]), end, None
    except ValueError:
        pass
    del lines
    out: list[bytes] = []
    pos = end - len(body) - 1
    for line in body.split(b"\n"):
        if line:
            data = unframe(line)
            if data is None:
                return b"\n".join(out), pos, Damage(path, pos, "checksum mismatch")
            if data is line and unchecked_decision(line):
                return b"\n".join(out), pos, Damage(path, pos, UNCHECKED_DECISION)
            out.append(data)
        pos += len(line) + 1
    return b"\n".join(out), end, None


def _decoded(path: Path, body: bytes, start: int,
             why: str) -> tuple[bytes, int, Damage | None]:
    """Like :func:`_verified`, finding the first line that does not decode (``body``: the
    lines as written, so offsets count their checksums)."""
    out: list[bytes] = []
    pos = start
    for line in body.split(b"\n"):
        if line:
            data = unframe(line)
            if data is None:
                break       # a checksum damage, and every line before it decodes
            _, _, bad = check_line(data)
            if bad:
                return b"\n".join(out), pos, Damage(path, pos, bad)
            out.append(data)
        pos += len(line) + 1
    raise RuntimeError(f"the fold failed on journal lines that all decode: {why}")


def stale_notice(token: int, count: int, path: Path) -> Notice:
    """What the ledger tells of the ``count`` records a superseded driver wrote to its
    segment ``path`` after a takeover: folded into ``notices``, and read from the tail
    the same until then (stamped with the segment's last write, so both say the same)."""
    try:
        ts = path.stat().st_mtime
    except FileNotFoundError:
        ts = time.time()
    return Notice(None, None, "stale_driver_rejected",
                  f"rejected {count} record(s) written under superseded token {token}", ts)


class BackgroundFold:
    """Folds a run's journal into the file in the background while the run goes on.

    Woken when ``policy.wake_bytes`` of journal were written, or every
    ``policy.interval`` seconds if anything was, from ``policy.first_fold``
    seconds into the drive on (a shorter drive is folded once, at release).
    DuckDB releases the GIL while it works, so on a machine with a spare core
    the fold overlaps the driver, and the fold left at release is only the tail.
    Each wake-up folds at most ``policy.bite_bytes`` and then leaves the file
    free for a while. A fold that finds the file locked (a reader) is retried
    at the next wake-up; the journal is the durable copy either way.
    """

    def __init__(self, fold_bite: Any, run_id: str, policy: FoldPolicy) -> None:
        self.fold_bite = fold_bite      # (run_id, max_bytes) -> more left?
        self.run_id = run_id
        self.policy = policy
        self.pending = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ledgerflow-fold-{run_id}")
        self._thread.start()

    def wrote(self, n: int) -> None:
        self.pending += n
        if self.pending >= self.policy.wake_bytes and not self._wake.is_set():
            self._wake.set()     # once: setting a set Event takes its lock every time

    def _run(self) -> None:
        policy = self.policy
        if self._stop.wait(policy.first_fold):
            return
        while True:
            self._wake.wait(policy.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self.pending:
                continue
            self.pending = 0     # advisory: bytes written meanwhile wake the next fold
            started = time.monotonic()
            try:
                if self.fold_bite(self.run_id, policy.bite_bytes):
                    self.pending = policy.wake_bytes
            except StoreLockedError:
                self.pending = 1
            except Exception:   # the fold at release reports what is still wrong
                log.warning("background fold of run %s failed", self.run_id, exc_info=True)
            # leave the file free a while (at least 50 ms)
            if self._stop.wait(max(0.05, (time.monotonic() - started) * policy.share)):
                return
            if self.pending >= policy.wake_bytes:
                self._wake.set()

    def stop(self) -> None:
        """Stop folding; waits for a fold in progress (the caller folds the rest)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
