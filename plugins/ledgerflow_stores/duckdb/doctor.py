"""Checking a ledger against its journals, and rebuilding its tables from them.

:func:`examine` explains what is wrong in plain words (the file, the
journals, unfolded tails, leases, result files); :func:`rebuild` folds every
journal into a fresh file and swaps it in atomically, keeping the old file
beside it. The journals are the source of truth: what they hold can always be
rebuilt; runs whose journals are gone (runs of the first release, folded and
deleted), and runs whose journal a damaged line cuts, are taken from the old file
when it can still be read (the journal then folds on from where the old tables
stopped), and the repair says what it dropped.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerflow.errors import (
    NotALedgerError,
    NotResumableError,
    PipelineError,
    SchemaVersionError,
)
from ledgerflow.projection import apply
from ledgerflow.records import FORMAT_VERSION, ApprovalDecided, DriverHeader
from ledgerflow.views import RunView

from . import queries, schema
from .connection import REPAIR, Ledger, sql_string
from .engine import duckdb
from .journal import Damage, check_line, iter_lines, read_records

if TYPE_CHECKING:
    from .store import DuckDBStore


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``pipeline doctor`` found: ``problem`` ones make it exit 2."""

    problem: bool
    what: str
    fix: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"problem": self.problem, "what": self.what, "fix": self.fix}


def _segments(store: DuckDBStore, run_id: str) -> list[tuple[int, Path]]:
    return store.journals.every_segment(run_id)


def _token_of(path: Path) -> int:
    """The driver token of a journal segment (``RUN.TOKEN.jsonl``, archived or not)."""
    stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
    token = stem.rsplit(".", 1)[-1]
    return int(token) if token.isdigit() else 0


def journal_view(store: DuckDBStore, run_id: str) -> tuple[RunView | None, list[Damage]]:
    """A run as its journals alone describe it (superseded tails left out)."""
    segs = _segments(store, run_id)
    view = RunView(run_id)
    damage: list[Damage] = []
    seen = False
    for _, path in segs:
        records, _, bad = read_records(path, 0)
        seen = seen or bool(records)
        apply(view, records)
        if bad is not None:
            damage.append(bad)
    return (view if seen and view.pipeline else None), damage


def examine(store: DuckDBStore) -> list[Finding]:
    """Everything worth saying about the ledger, problems first."""
    out: list[Finding] = []
    repair = REPAIR
    table_runs: dict[str, RunView] = {}
    known: set[tuple[str, int]] = set()        # damage the tables hold (folded up to it)
    repaired: set[tuple[str, int]] = set()     # damage a repair kept the good part of
    readable = True
    try:
        with store.ledger.connect(False) as con:
            version = store.ledger.version
            if con is not None:
                known, repaired = _damage_known(con)
                table_runs = queries.list_runs(con, 1_000_000)
                for rid in list(table_runs):
                    view = queries.load_run(con, rid, upstream=False)
                    if view is not None:
                        table_runs[rid] = view
            if store.ledger.exists():
                out.append(Finding(False, f"ledger file {store.location}: schema version "
                                   f"{version}" + (" (no tables yet)" if version == 0 else "")))
            else:
                out.append(Finding(False, f"no ledger file yet at {store.location}"))
    except SchemaVersionError as exc:
        readable = False
        out.append(Finding(True, str(exc), _UPGRADE))
    except PipelineError as exc:
        readable = False
        out.append(Finding(True, f"the ledger file cannot be read: {exc}",
                           (exc.hint or repair) if _foreign(store, exc) else repair))
    journal_runs = store.journals.all_runs()
    for rid in sorted(journal_runs):
        newer = _newer_format(store, rid)
        if newer:
            out.append(Finding(True, f"run {rid}: {newer}", _UPGRADE))
    for rid in sorted(journal_runs):
        try:
            jview, damage = journal_view(store, rid)
        except OSError as exc:
            out.append(Finding(True, f"run {rid}: a journal cannot be read: {exc}", repair))
            continue
        newest = max((t for t, _ in _segments(store, rid)), default=0)
        for d in damage:
            if _token_of(d.path) < newest:      # a later driver went on past it
                out.append(Finding(False, f"run {rid}: {d.describe()} (history: a resume "
                                   "went on past it; what it held after that point was "
                                   "run again)"))
                continue
            if (rid, _token_of(d.path)) in repaired:
                out.append(Finding(False, f"run {rid}: {d.describe()} (history: pipeline "
                                   "repair kept what came before it; what it held after "
                                   "that point is dropped)"))
                continue
            out.append(Finding(True, f"run {rid}: {d.describe()}; what it held after that "
                               "point is not applied", f"pipeline resume {rid} re-runs it "
                               "(at-least-once); pipeline repair keeps the good part"))
        if jview is None:
            out.append(Finding(True, f"run {rid}: its journal holds no readable run", repair))
            continue
        live = store.journals.segments(rid)
        if readable and live and not store.driver_alive(rid):
            folded = _folded(store, rid)
            # past a damage the tables know of there is nothing to fold (said above)
            left = sum(max(0, p.stat().st_size - folded.get(t, 0)) for t, p in live
                       if (rid, t) not in known)
            if left:
                out.append(Finding(True, f"run {rid}: {left} bytes of journal not folded "
                                   "into the tables (its driver stopped before its last "
                                   "fold)", "pipeline fold (any command that writes does it "
                                   "too)"))
        sql = table_runs.get(rid)
        if readable and sql is None and not live:
            out.append(Finding(True, f"run {rid} is in its journal but not in the tables",
                               repair))
        if readable and sql is not None and not damage and not live:
            bad = _disagree(sql, jview)
            if bad:
                out.append(Finding(True, f"run {rid}: the tables disagree with its journal "
                                   f"({bad})", repair))
        if jview.active and not store.driver_alive(rid):
            what = ("waits for a driver (submitted)" if jview.state == "submitted"
                    else "was being driven when its driver stopped")
            out.append(Finding(False, f"run {rid} {what}: resumable",
                               f"pipeline resume {rid}"))
    out.extend(_bad_decisions(store))
    if readable:
        for rid in sorted(set(table_runs) - journal_runs):
            out.append(Finding(False, f"run {rid} has no journal (folded by an older "
                               "ledgerflow): repair keeps its rows from the file, nothing "
                               "can rebuild them if the file is lost"))
        out.extend(_missing_results(store))
    return sorted(out, key=lambda f: not f.problem)


#: The notice a repair leaves for each damage it cut a journal at (doctor reads it back).
_REPAIRED = "journal_damage_repaired"
_REPAIRED_TOKEN = re.compile(r"journal token (\d+) cut at byte")


def _damage_known(con: Any) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """``(run, token)`` of the journal damage the tables hold, and of that a repair cut."""
    try:
        known = {(r, int(t)) for r, t in con.execute(
            "SELECT DISTINCT run_id, token FROM journal_damage").fetchall()}
        notes = con.execute("SELECT run_id, message FROM notices WHERE kind = ?",
                            [_REPAIRED]).fetchall()
    except duckdb.Error:        # tables of an older schema: nothing known
        return set(), set()
    repaired = {(r, int(m.group(1))) for r, msg in notes
                if (m := _REPAIRED_TOKEN.search(msg or "")) is not None}
    return known, repaired


def _bad_decisions(store: DuckDBStore) -> list[Finding]:
    """The decision files that do not check: damage, unless the journal holds the
    request's decision anyway (a file an older ledgerflow wrote without a checksum)."""
    out: list[Finding] = []
    journaled: dict[str, set[str]] = {}
    for rid, path, why in store.decisions.damaged():
        if rid not in journaled:
            try:
                journaled[rid] = {r.digest for r in store._kind_rows(rid, ApprovalDecided)}
            except PipelineError:
                journaled[rid] = set()
        if path.name.removesuffix(".json") in journaled[rid]:
            out.append(Finding(False, f"run {rid}: the decision file {path} does not check "
                               f"({why}); its request was decided in the journal, so it "
                               "changes nothing", "remove it"))
            continue
        out.append(Finding(True, f"run {rid}: the decision file {path} is damaged ({why}): "
                           "it is no decision, and its request stays undecided",
                           f"remove it, then decide again (pipeline approvals {rid} shows "
                           "the request)"))
    return out


def _folded(store: DuckDBStore, run_id: str) -> dict[int, int]:
    with store.ledger.connect(False) as con:
        return queries.folded_offsets(con, run_id)


def _disagree(sql: RunView, journal: RunView) -> str:
    if sql.state != journal.state:
        return f"run state {sql.state!r} in the tables, {journal.state!r} in the journal"
    if set(sql.tasks) != set(journal.tasks):
        return (f"{len(sql.tasks)} task rows in the tables, {len(journal.tasks)} in the "
                "journal")
    diff = [k for k, t in journal.tasks.items() if sql.tasks[k].state != t.state]
    if diff:
        return f"{len(diff)} task(s) in another state, e.g. {diff[0]}"
    return ""


def _missing_results(store: DuckDBStore) -> list[Finding]:
    out: list[Finding] = []
    with store.ledger.connect(False) as con:
        if con is None:
            return out
        rows = con.execute("SELECT run_id, task_key, result_uri FROM tasks WHERE "
                           "state = 'succeeded' AND result_uri IS NOT NULL").fetchall()
    for rid, key, uri in rows:
        if not store.blobs.path(uri).exists():
            out.append(Finding(True, f"run {rid}: the result file of {key} is missing "
                               f"({store.blobs.path(uri)})",
                               f"new runs do not reuse it; a resume of an unfinished run "
                               f"({rid}) runs {key} again"))
    return out


_UPGRADE = ("upgrade ledgerflow to the release that wrote it (pipeline repair refuses: "
            "rebuilding it with this one would drop what the newer one wrote)")


def _newer_format(store: DuckDBStore, run_id: str) -> str:
    """Why ``run_id``'s journal was written by a newer ledgerflow ("" if it was not):
    a driver header of a newer record format."""
    for _, path in _segments(store, run_id):
        header = _header(path)
        if header is not None and header.format > FORMAT_VERSION:
            return (f"journal {path.name} was written by a newer ledgerflow (record "
                    f"format {header.format}; this one reads up to {FORMAT_VERSION})")
    return ""


def _header(path: Path) -> DriverHeader | None:
    """The driver header of a segment (among its first lines), if it has one."""
    for body, _ in iter_lines(path, 0, 4096):
        for line in body.split(b"\n")[:4]:
            for r in check_line(line)[1]:
                if isinstance(r, DriverHeader):
                    return r
        return None
    return None


def _foreign(store: DuckDBStore, exc: Exception) -> bool:
    """True if the file is not a ledger and no journal says it ever was one."""
    return isinstance(exc, NotALedgerError) and not store.journals.all_runs()


def rebuild(store: DuckDBStore) -> tuple[str, list[str]]:
    """Rebuild the tables from the journals into a new file and swap it in.

    Returns the path the old file was kept at and what was cut. Refuses while
    a driver is alive.
    """
    try:
        with store.ledger.connect(False):
            pass
    except NotALedgerError as exc:
        if _foreign(store, exc):
            raise NotALedgerError(f"{exc}, and no journals are beside it: nothing to rebuild "
                                  "(the file is left as it is)", hint=exc.hint) from None
    except SchemaVersionError as exc:
        raise SchemaVersionError(f"{exc}: a repair would drop what it wrote, so nothing "
                                 "was changed", hint=_UPGRADE) from None
    except PipelineError:
        pass        # damaged: rebuilt below
    for rid in sorted(store.journals.all_runs()):
        newer = _newer_format(store, rid)
        if newer:
            raise SchemaVersionError(f"run {rid}: {newer}: a repair would drop what it "
                                     "wrote, so nothing was changed", hint=_UPGRADE)
    for rid in store.journals.runs():
        if store.driver_alive(rid):
            raise NotResumableError(f"run {rid} is being driven right now; repair needs the "
                                    "ledger to itself", hint="wait for it, or cancel it first")
    notes: list[str] = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    new_path = f"{store.location}.repair-{stamp}.tmp"
    fresh = Ledger(new_path, store.ledger.lock_timeout, marked=False)
    with store.ledger.lock, fresh.connect(True) as con:
        runs = sorted(store.journals.all_runs())
        for rid in runs:
            store.folds.run(con, rid, segs=_segments(store, rid))
        cut = [rid for rid in runs if _damage(con, rid)]
        kept_rows, copied = _copy_from_old(store, con, cut)
        notes.extend(copied)
        for rid in kept_rows:       # what the journals hold past what the old tables folded
            store.folds.run(con, rid, segs=_segments(store, rid))
        for rid in cut:
            for token, offset, reason in _damage(con, rid):
                notes.append(f"run {rid}: journal token {token} cut at byte {offset} "
                             f"({reason}); what follows it there is dropped")
                # kept in the tables: pipeline doctor tells this damage as history
                con.execute("INSERT INTO notices VALUES (?, NULL, NULL, ?, ?, ?)",
                            [rid, _REPAIRED, f"pipeline repair: journal token {token} cut "
                             f"at byte {offset} ({reason}); what followed it is dropped",
                             time.time()])
    kept = f"{store.location}.broken-{stamp}"
    with store.ledger.lock:
        if os.path.exists(store.location):
            os.replace(store.location, kept)
            with contextlib.suppress(FileNotFoundError):
                os.replace(store.location + ".wal", kept + ".wal")
        os.replace(new_path, store.location)
    store.ledger.version = None
    return kept, notes



def _damage(con: Any, run_id: str) -> list[tuple[int, int, str]]:
    rows: list[tuple[int, int, str]] = con.execute(
        'SELECT token, "offset", reason FROM journal_damage WHERE run_id = ? ORDER BY token',
        [run_id]).fetchall()
    return rows


def _copy_from_old(store: DuckDBStore, con: Any,
                   cut: list[str]) -> tuple[list[str], list[str]]:
    """Copy from the old file (if it can be read) the rows of runs that have no journal,
    and of runs whose journal is cut by damage: the old tables were folded from it
    while it was whole, so their rows (and how far they folded) replace what the
    journal still gives; the caller folds the journal on from there. Returns the cut
    runs kept from the old tables, and notes."""
    if not os.path.exists(store.location):
        return [], []
    have = set(store.journals.all_runs())
    try:
        con.execute(f"ATTACH {sql_string(store.location)} AS old (READ_ONLY)")
    except duckdb.Error as exc:
        return [], [f"the old file cannot be read ({str(exc).splitlines()[0][:120]}); every "
                    "run with a journal was rebuilt from it alone, runs folded by "
                    "ledgerflow 0.1 without one (if there were any) are lost"]
    notes: list[str] = []
    kept: list[str] = []
    try:
        tables = _old_tables(con)
        old_runs = {r for (r,) in con.execute("SELECT run_id FROM old.runs").fetchall()}
        unjournaled = sorted(old_runs - have)
        if unjournaled:
            _copy_rows(con, tables, unjournaled, replace=False)
            notes.append(f"{len(unjournaled)} run(s) without a journal copied from the "
                         "old file")
        for rid in cut:
            if rid not in old_runs:
                continue
            try:
                con.execute("BEGIN TRANSACTION")
                _copy_rows(con, tables, [rid], replace=True)
                con.execute("COMMIT")
            except duckdb.Error as exc:
                con.execute("ROLLBACK")
                notes.append(f"run {rid}: the old tables' rows could not be kept "
                             f"({str(exc).splitlines()[0][:120]}); rebuilt from its journal")
                continue
            kept.append(rid)
            (n,) = con.execute("SELECT count(*) FROM tasks WHERE run_id = ?", [rid]).fetchone()
            notes.append(f"run {rid}: its {n} task row(s) kept from the old tables (folded "
                         "before the journal was damaged)")
    except duckdb.Error as exc:
        notes.append(f"rows could not be copied from the old file "
                     f"({str(exc).splitlines()[0][:120]})")
    finally:
        con.execute("DETACH old")
    return kept, notes


def _old_tables(con: Any) -> dict[str, list[str]]:
    """The old file's tables that hold rows by run, with their columns."""
    out: dict[str, list[str]] = {}
    for (table,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'old' "
            "AND table_type = 'BASE TABLE'").fetchall():
        cols = [c for (c,) in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE "
            "table_catalog = 'old' AND table_name = ? ORDER BY ordinal_position",
            [table]).fetchall()]
        if table != "meta" and "run_id" in cols:
            out[table] = cols
    return out


#: Old tables whose rows a newer schema keeps in another table (version 5: ``events``
#: is a view of ``event_rows`` and of task rows; version 6: ``results`` and ``attempts``
#: likewise).
_RENAMED = {"events": "event_rows", "results": "result_rows", "attempts": "attempt_rows"}


def _copy_rows(con: Any, tables: dict[str, list[str]], runs: list[str], *,
               replace: bool) -> None:
    for table, cols in tables.items():
        names = ", ".join(f'"{c}"' for c in cols)
        target = _RENAMED.get(table, table)
        if replace:
            con.execute(f'DELETE FROM main."{target}" WHERE run_id IN '
                        "(SELECT unnest($1::VARCHAR[]))", [runs])
        con.execute(f'INSERT INTO main."{target}" ({names}) SELECT {names} FROM '
                    f'old."{table}" WHERE run_id IN (SELECT unnest($1::VARCHAR[]))', [runs])


_ = schema  # the fresh file gets the current schema through Ledger.connect(True)
