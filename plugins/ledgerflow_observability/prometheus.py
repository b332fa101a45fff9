"""The ``prometheus`` plugin: counters and histograms of runs, in the Prometheus text format.

Off until ``LEDGERFLOW_PROMETHEUS`` is ``1`` (a textfile beside the
ledger, ``<ledger>.d/metrics.prom``) or a path (that file; a directory:
``ledgerflow.prom`` in it, e.g. node-exporter's textfile directory), or
:func:`enable` is called.

Drivers count what their commits hold (:mod:`ledgerflow_observability._metrics`
lists the metrics; the gauges of runs in progress and waiting approvals are
read from the ledger, :mod:`ledgerflow_observability._gauges`) and add it to
the textfile every
``LEDGERFLOW_PROMETHEUS_INTERVAL`` seconds (10) and when a run stops, under
a file lock, so the file holds the sums of every driver that wrote it.
``pipeline console`` serves the same file at ``/metrics``
(:func:`exposition`); without a console, point node-exporter's textfile
collector at it. prometheus-client is imported only to write or read it.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

from ledgerflow import hookimpl

from ._metrics import Counting
from ._settings import prometheus_interval, prometheus_target
from ._switch import Switch

if TYPE_CHECKING:
    from ledgerflow.records import Record
    from ledgerflow.store import RunStore

__all__ = ["CONTENT_TYPE", "Observer", "disable", "enable", "enabled", "exposition",
           "textfile_for"]

log = logging.getLogger("ledgerflow")

#: The content type of the Prometheus text format (version 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FILE_NAME = "ledgerflow.prom"


def _resolve(target: str, store_location: str | None, store_kind: str = "duckdb"
             ) -> Path | None:
    if target != "ledger":
        path = Path(target)
        if path.is_dir() or target.endswith(os.sep):
            path = path / FILE_NAME
        return path
    if store_kind != "duckdb" or not store_location:
        return None
    return Path(store_location + ".d") / "metrics.prom"


def textfile_for(store: str | None = None) -> Path | None:
    """The textfile the console serves for the ledger ``store`` (None: the default).

    ``LEDGERFLOW_PROMETHEUS`` when it is a path, else the file beside the
    ledger that drivers write with ``LEDGERFLOW_PROMETHEUS=1``.
    """
    target = prometheus_target()
    if target not in (None, "ledger"):
        return _resolve(str(target), None)
    from ledgerflow.config import Settings
    settings = Settings.from_env(**({"store": store} if store else {}))
    return _resolve("ledger", settings.store, settings.store_kind)


def exposition(store: str | None = None) -> bytes:
    """The metrics text the console's ``/metrics`` answers (empty before any write): the
    textfile, with the gauges of the ledger ``store`` read now."""
    path = textfile_for(store)
    if path is None:
        return b""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return b""
    try:
        from ledgerflow.control import open_ledger

        from . import _gauges
        from ._prometheus import with_gauges
        ledger = open_ledger(store)
        return with_gauges(text, _gauges.ledger_label(ledger), _gauges.read(ledger))
    except Exception:   # the ledger cannot be read now: serve the file as it is
        log.warning("Prometheus metrics: the gauges could not be read", exc_info=True)
        return text.encode()


class Observer:
    """The driver-side hooks, registered while metrics are on."""

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 interval: float | None = None) -> None:
        self.target = os.fspath(path) if path is not None else (prometheus_target() or "ledger")
        self.interval = interval if interval is not None else prometheus_interval()
        self.counting = Counting()
        self.paths: dict[str, Path | None] = {}       # run id -> its textfile
        self.stores: dict[str, RunStore] = {}         # run id -> its ledger (the gauges)
        self.pending: set[Path] = set()
        self.next_write = time.monotonic() + self.interval
        self._warned = False
        atexit.register(self.write)

    @hookimpl
    def ledgerflow_records_committed(self, run_id: str, records: Sequence[Record],
                                     store: RunStore) -> None:
        if run_id not in self.paths:
            path = _resolve(self.target, store.location, store.name)
            if path is None and not self._warned:
                self._warned = True
                log.warning("Prometheus metrics: store %r keeps no files; set "
                            "LEDGERFLOW_PROMETHEUS=PATH to write a textfile", store.name)
            self.paths[run_id] = path
            self.stores[run_id] = store
        path = self.paths[run_id]
        self.counting.committed(run_id, records, store)
        if path is not None:
            self.pending.add(path)
            if time.monotonic() >= self.next_write:
                self.write()

    @hookimpl
    def ledgerflow_run_finish(self, run_id: str) -> None:
        self.counting.finish(run_id)
        self.write()
        self.paths.pop(run_id, None)
        self.stores.pop(run_id, None)

    def write(self) -> None:
        """Add what was counted since the last write to the textfile(s)."""
        self.next_write = time.monotonic() + self.interval
        if self.counting.metrics.empty() or not self.pending:
            return
        try:
            from ._prometheus import merge_into
            paths = sorted(self.pending, key=str)
            if len(paths) > 1:      # runs of several ledgers in one process: each its own
                log.warning("Prometheus metrics: runs of several ledgers in one process; "
                            "all counts go to %s", paths[0])
            merge_into(paths[0], self.counting.metrics, self._gauges(paths[0]))
        except Exception:   # metrics must never break a run
            log.exception("Prometheus textfile could not be written")

    def _gauges(self, path: Path) -> tuple[str, dict[str, dict[tuple[str, ...], float]]] | None:
        """The gauges of the ledger of a run counted into ``path`` (None: none to read)."""
        store = next((self.stores[r] for r, p in self.paths.items()
                      if p == path and r in self.stores), None)
        if store is None:
            return None
        from . import _gauges
        try:
            return _gauges.ledger_label(store), _gauges.read(store)
        except Exception:   # a ledger that cannot be read now: the counts still go out
            log.warning("Prometheus metrics: the gauges could not be read from %s",
                        store.location or store.name, exc_info=True)
            return None

    def close(self) -> None:
        """Write what is left; stop writing at exit."""
        self.write()
        atexit.unregister(self.write)


SWITCH = Switch("prometheus.observer", Observer)


def enable(path: str | os.PathLike[str] | None = None, *,
           interval: float | None = None) -> Observer:
    """Count the runs of this process into the textfile ``path`` (default: the setting,
    else beside the ledger)."""
    obs: Observer = SWITCH.enable(path=path, interval=interval)
    return obs


def disable() -> None:
    """Stop counting (what was counted is written first)."""
    SWITCH.disable()


def enabled() -> bool:
    """True while the runs of this process are counted."""
    return SWITCH.enabled


@hookimpl
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    if prometheus_target() and not SWITCH.enabled:
        SWITCH.register(pluginmanager)
