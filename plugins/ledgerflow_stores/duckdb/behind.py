"""The fold a released run leaves behind: done on a thread of this process, after the
caller goes on.

A run is durable once its journal is written; the fold only brings the SQL
tables up to date (readers through ledgerflow add the unfolded tail). So with
``FoldPolicy.behind`` (the default; ``LEDGERFLOW_FOLD_BEHIND=0`` turns it off)
:meth:`DuckDBStore.release` hands the fold of the run's tail to a thread and
returns: a 1,000-task run returns in ~20 ms instead of ~100 (a fold costs
~40 ms however small, most of it DuckDB's checkpoint and statement planning).

The thread is not a daemon: the interpreter waits for it at exit, so a script
or a ``pipeline run`` process ends with its tables current. This process's own
reads wait for the file's lock meanwhile (and add the tail, as always); a
takeover, ``pipeline fold`` and :func:`settle` wait for the fold itself. A
process killed first leaves the journal, which the next writer folds.

Only a file that exists is folded behind. The first run of a new ledger makes its
file before it returns, and a fold behind never makes one: a run into a temporary
folder removed as the run returns (``with TemporaryDirectory() as d:``) leaves
nothing there, and no warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .threads import RunThreads

log = logging.getLogger("ledgerflow")

#: the threads folding what runs' releases left, by ledger location and run
_BEHIND = RunThreads("fold-behind")


def start(location: str, run_id: str, work: Callable[[], None]) -> None:
    """Run ``work`` (the fold of ``run_id``'s tail, then the lease's removal) on a
    thread of its own; an earlier one of the same run is waited for first."""
    def body() -> None:
        try:
            work()
        except Exception as exc:    # the journal holds the run; the next writer folds it
            log.warning("run %s: folding its journal into %s failed (%s); readers add "
                        "the journal, and the next run, resume or pipeline fold folds it",
                        run_id, location, exc)
    _BEHIND.start(location, run_id, body)


def settle(location: str, run_id: str | None = None) -> None:
    """Wait for the folds this process left behind in ``location`` (of ``run_id``, or of
    every run); from such a fold's own thread, wait for none."""
    _BEHIND.wait(location, run_id)
