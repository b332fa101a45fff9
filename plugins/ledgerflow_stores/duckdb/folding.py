"""Folding a DuckDB store's journals into its file: a run's tail at its release (behind
it, see :mod:`.behind`), a bounded bite in the background, every run a killed driver
left; and waiting until the tables hold what this process committed.

A mixin of :class:`.store.DuckDBStore`: it works on the store's ledger, journals,
leases and fold, and asks the store whether a run's driver lives.
"""

from __future__ import annotations

import logging

from ledgerflow.errors import PipelineError, StoreError, StoreLockedError
from ledgerflow.store import Lease

from . import behind
from .batch import RUN_TERMINAL_VALUES
from .connection import Ledger
from .fold import Fold, FoldPolicy
from .journal import Journals
from .lease import Leases

log = logging.getLogger("ledgerflow")


class Folding:
    """The folding half of :class:`.store.DuckDBStore`."""

    location: str
    ledger: Ledger
    journals: Journals
    leases: Leases
    folds: Fold
    policy: FoldPolicy

    def driver_alive(self, run_id: str) -> bool:
        raise NotImplementedError

    def _fold_released(self, lease: Lease, behind: bool = False) -> None:
        """Fold what a released run left (its lease stays until then), then drop the
        lease; ``behind``: on a thread of its own, the caller gone on."""
        try:
            self.fold_run(lease.run_id, archive_finished=True, token=lease.token,
                          behind=behind)
        except StoreLockedError:
            # readers add the tail, the next writer folds it; SQL users are told
            log.warning("run %s: the ledger %s was locked by another process, so its SQL "
                        "tables are behind the journal until the next run or resume folds "
                        "it, or: pipeline fold --store %s", lease.run_id, self.location,
                        self.location)
        except PipelineError:
            if not behind or self.ledger.exists():
                raise
            # removed, before the fold or during it (a temporary folder at the end of its
            # block): the run went with it
            log.debug("run %s: the ledger %s is gone, nothing to fold", lease.run_id,
                      self.location)
        finally:
            self.leases.remove(lease.run_id, lease.token)

    def settle(self, run_id: str | None = None) -> None:
        """Wait until the tables hold what this process committed (of ``run_id``, or of
        every run): the folds its releases left behind (:mod:`.behind`), the archiving."""
        self._folded_behind(run_id)
        self.journals.settle(run_id)

    def _folded_behind(self, run_id: str | None = None) -> None:
        """Wait for the folds this process's releases left behind (of ``run_id``, or of
        every run); from a thread that holds the file (a read block), for none: the fold
        needs the file (and the block's reads add the journal tail)."""
        if not self.ledger.held():
            behind.settle(self.location, run_id)

    def _fold_bite(self, run_id: str, max_bytes: int) -> bool:
        # a bounded bite, then the file is free again for readers in other processes
        waiting = self.ledger.waiting
        if waiting.any():
            return True         # a reader waits for the file: try again a bit later
        with self.ledger.connect(True, timeout=0.05) as con:
            return self.folds.run(con, run_id, max_bytes=max_bytes, yield_to=waiting.any)

    def fold_run(self, run_id: str, *, max_bytes: int | None = None,
                 archive_finished: bool = False, token: int | None = None,
                 behind: bool = False) -> bool:
        """Fold ``run_id``'s journal now, in bites of ``policy.bite_bytes``.

        With ``max_bytes``, stop after about that much and return True if more
        is left. With ``archive_finished``, a finished, fully folded run's
        journal is archived (compressed): its segments up to ``token`` if given (a
        later driver's segment is live).
        """
        budget = max_bytes
        self.folds.states.pop(run_id, None)     # (what this call folds says the state)
        while True:
            bite = self.policy.bite_bytes if budget is None else min(budget,
                                                                     self.policy.bite_bytes)
            # each bite on a fresh connection: DuckDB keeps what it cached while a
            # connection stays open, on top of the run's own memory
            # readers of other processes waiting for the file get in first (a
            # bounded wait, then at least one batch: the fold is never starved)
            waiting = self.ledger.waiting
            waiting.wait_gone(timeout=min(5.0, self.ledger.lock_timeout))
            with self.ledger.connect(True, create=not behind) as con:
                more = self.folds.run(con, run_id, max_bytes=bite, yield_to=waiting.any)
                if more:
                    if budget is not None:
                        budget -= bite
                        if budget <= 0:
                            return True
                    continue
                state = None
                if archive_finished:
                    # the state this call's batches moved the run to, else the folded one
                    state = self.folds.states.pop(run_id, None)
                    if state is None:
                        row = con.execute("SELECT state FROM runs WHERE run_id = ?",
                                          [run_id]).fetchone()
                        state = row[0] if row else None
            if state in RUN_TERMINAL_VALUES:
                # fully folded and finished: compressed (after the file is left free),
                # kept for repair
                self.journals.archive_soon(run_id, upto=token)
            return False

    def fold(self) -> list[str]:
        """Fold every journal whose driver is gone into the file now; return their runs."""
        done = []
        for run_id in sorted(self.journals.runs()):
            if not self.driver_alive(run_id):
                self.fold_run(run_id, archive_finished=True)
                done.append(run_id)
        return done

    def recover(self) -> None:
        """Fold what drivers that stopped (killed) left unfolded, so the tables (and the
        cache index, lineage, users' SQL) are current. Called by commands that write."""
        try:
            self.fold()
        except PipelineError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot fold the journals of {self.location}: {exc}",
                             hint="check the ledger folder's permissions") from None
