"""Where a DuckDB fold's time goes: ``python -m tests.perf.fold_anatomy [--tasks 10 10000]``.

For each size, runs one inline chain into a ledger that does not fold at release,
then folds copies of that ledger (journal included) ``--repeat`` times, the way a
release does (``DuckDBStore.fold_run``), and prints the median fold and the
median time of each SQL statement it ran, slowest first. The fixed cost of a
small run's fold and the per-task cost of a large one read off the same table.
Never part of the test suite.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ledgerflow_stores.duckdb import connection
from ledgerflow_stores.duckdb.fold import FoldPolicy
from ledgerflow_stores.duckdb.store import DuckDBStore

from .__main__ import chain, next_salt

#: (seconds, statement) of every statement run on an attached ledger while recording.
_LOG: list[tuple[float, str]] = []


def _record_statements() -> None:
    """Time every statement :class:`connection.Attached` runs (into :data:`_LOG`)."""
    plain = connection.Attached.execute

    def timed(self: Any, query: str, parameters: Any = None) -> Any:
        t = time.perf_counter()
        try:
            return plain(self, query, parameters)
        finally:
            _LOG.append((time.perf_counter() - t, query))

    connection.Attached.execute = timed  # type: ignore[method-assign]


def _unfolded_run(folder: Path, n: int) -> tuple[Path, str]:
    """A ledger with a few folded runs and one ``n``-task chain left in its journal."""
    path = folder / "ledger.duckdb"
    for _ in range(3):      # tables, code versions and imports, as a used ledger has
        chain.run(n=1, salt=next_salt(), store=str(path), executor="inline")
    keep = DuckDBStore(str(path), policy=FoldPolicy(fold_at_release=False, interval=3600))
    run = chain.run(n=n, salt=next_salt(), store=keep, executor="inline")
    assert run.state == "succeeded", run.state
    keep.journals.settle()      # the earlier runs' archiving ends before the ledger is copied
    return path, run.run_id


def _fold_copy(path: Path, run_id: str) -> tuple[float, list[tuple[float, str]]]:
    """Fold a copy of ``path`` and its side folder; the fold's seconds and statements."""
    with tempfile.TemporaryDirectory(prefix="lf-fold-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copy(path, copy)
        shutil.copytree(f"{path}.d", f"{copy}.d")
        store = DuckDBStore(str(copy))
        _LOG.clear()
        t = time.perf_counter()
        store.fold_run(run_id, archive_finished=True)
        took = time.perf_counter() - t
        store.journals.settle()     # its archiving (off the fold's path) ends before the copy goes
        return took, list(_LOG)


def _label(query: str) -> str:
    return " ".join(query.split())[:96]


def anatomy(n: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="lf-anatomy-") as tmp:
        path, run_id = _unfolded_run(Path(tmp), n)
        totals: list[float] = []
        per: dict[str, list[float]] = defaultdict(list)
        for _ in range(repeat):
            total, log = _fold_copy(path, run_id)
            totals.append(total)
            seen: dict[str, float] = defaultdict(float)
            for dt, query in log:
                seen[_label(query)] += dt
            for label, dt in seen.items():
                per[label].append(dt)
    fold = statistics.median(totals)
    rows = sorted(((statistics.median(v), k, len(v)) for k, v in per.items()), reverse=True)
    sql = sum(ms for ms, _, _ in rows)
    print(f"\nfold of a {n}-task chain: {fold * 1e3:.1f} ms ({fold / n * 1e6:.1f} µs a task), "
          f"{sql * 1e3:.1f} ms of it in {len(rows)} statements, median of {repeat}")
    for ms, label, _ in rows:
        print(f"  {ms * 1e3:7.2f} ms  {label}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[10, 10_000])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    _record_statements()
    for n in args.tasks:
        anatomy(n, args.repeat)


if __name__ == "__main__":
    main()
