"""The memory store's cache index: each idle run's successes merged once, newest run first.

A notebook that ran a pipeline fifty times holds fifty runs' successes; a
new run's cache lookup must not read them all again. :class:`MergedIndex`
folds each run's successes in once it is idle (a driven run changes, so it
is read as it is at each lookup) and keeps, per fingerprint, the entry of
the newest run that has it. A lookup is then a view (:class:`Hits`) that
answers ``get`` from the merged entries, the driven runs' own and, for the
rare fingerprint whose newest entry is the excluded run's, a scan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ledgerflow.store import CacheHit

#: fingerprint -> (task name, cache hit), of one run
Successes = dict[str, tuple[str, CacheHit]]


class MergedIndex:
    """Per fingerprint, the newest idle run's entry: (run order, task name, hit)."""

    def __init__(self) -> None:
        self.by_fp: dict[str, tuple[int, str, CacheHit]] = {}
        self.merged: set[str] = set()

    def add(self, run_id: str, order: int, successes: Successes) -> None:
        """Merge the successes of ``run_id``, the run created ``order``-th (a later one
        wins; the same run again, after a resume, replaces its own entries)."""
        self.merged.add(run_id)
        by_fp = self.by_fp
        for fp, (name, hit) in successes.items():
            cur = by_fp.get(fp)
            if cur is None or cur[0] <= order:
                by_fp[fp] = (order, name, hit)

    def forget(self, run_id: str) -> None:
        """``run_id`` is driven again: merge it anew once it is idle."""
        self.merged.discard(run_id)


class Hits(Mapping[str, CacheHit]):
    """The cache entries of one lookup: task names ``wanted``, never ``exclude_run``'s."""

    def __init__(self, index: MergedIndex, wanted: set[str], exclude_run: str | None,
                 live: list[tuple[int, Successes]],
                 scan: Callable[[], dict[str, CacheHit]]) -> None:
        self.index, self.wanted, self.exclude_run = index, wanted, exclude_run
        self.live = live        # (order, successes) of the runs driven now, newest first
        self._scan = scan
        self._all: dict[str, CacheHit] | None = None

    def get(self, fp: str, default: Any = None) -> Any:
        """The newest entry for ``fp`` of a wanted task, from any run but the excluded one."""
        best: tuple[int, CacheHit] | None = None
        entry = self.index.by_fp.get(fp)
        if entry is not None and entry[1] in self.wanted:
            if entry[2][0] == self.exclude_run:
                return self._entries().get(fp, default)    # the next newest: a scan (rare)
            best = (entry[0], entry[2])
        for order, successes in self.live:
            found = successes.get(fp)
            if found is not None and found[0] in self.wanted \
                    and found[1][0] != self.exclude_run:
                if best is None or order > best[0]:
                    best = (order, found[1])
                break
        return default if best is None else best[1]

    def _entries(self) -> dict[str, CacheHit]:
        if self._all is None:
            self._all = self._scan()
        return self._all

    def __getitem__(self, fp: str) -> CacheHit:
        hit = self.get(fp)
        if hit is None:
            raise KeyError(fp)
        return hit  # type: ignore[no-any-return]

    def __contains__(self, fp: object) -> bool:
        return isinstance(fp, str) and self.get(fp) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())
