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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ledgerflow")

#: (ledger location, run id) -> the thread folding what the run's release left
_BEHIND: dict[tuple[str, str], threading.Thread] = {}
_GUARD = threading.Lock()


def start(location: str, run_id: str, work: Callable[[], None]) -> None:
    """Run ``work`` (the fold of ``run_id``'s tail, then the lease's removal) on a
    thread of its own; an earlier one of the same run is waited for first."""
    settle(location, run_id)

    def body() -> None:
        try:
            work()
        except Exception as exc:    # the journal holds the run; the next writer folds it
            log.warning("run %s: folding its journal into %s failed (%s); readers add "
                        "the journal, and the next run, resume or pipeline fold folds it",
                        run_id, location, exc)

    thread = threading.Thread(target=body, name=f"ledgerflow-fold-behind-{run_id}")
    with _GUARD:
        _BEHIND[(location, run_id)] = thread
    thread.start()


def settle(location: str, run_id: str | None = None, held: Any = None) -> None:
    """Wait for the folds this process left behind in ``location`` (of ``run_id``, or of
    every run); from such a fold's own thread, or while this thread holds ``held`` (the
    file's process lock, which the fold needs: a read block), wait for none."""
    if held is not None and held._is_owned():
        return
    me = threading.current_thread()
    with _GUARD:
        keys = [k for k in _BEHIND if k[0] == location and run_id in (None, k[1])]
    for key in keys:
        with _GUARD:
            thread = _BEHIND.get(key)
        if thread is None or thread is me:
            continue
        thread.join()
        with _GUARD:
            if _BEHIND.get(key) is thread:
                del _BEHIND[key]

