"""The Prometheus text: merging this process's deltas into a shared textfile.

The textfile is cumulative across every driver that writes it: under an
exclusive lock (``fcntl.flock`` on ``FILE.lock``) the file is parsed with
``prometheus_client``'s parser, this process's deltas are added, the
gauges of the writer's ledger (:mod:`ledgerflow_observability._gauges`)
replace that ledger's earlier ones, and the result is written back
atomically (``write_to_textfile``: a temporary file renamed over it).
node-exporter's textfile collector reads it as it is; the console's
``/metrics`` serves it with its ledger's gauges read again
(:func:`with_gauges`). Imported only when metrics are written or served.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ._gauges import GAUGES, Gauges, replace
from ._metrics import BUCKETS, COUNTERS, HISTOGRAMS, Labels, Metrics

log = logging.getLogger("ledgerflow")

Counters = dict[str, dict[Labels, float]]
Hists = dict[str, dict[Labels, list[float]]]
#: What a textfile holds: counters, histograms (per-bucket counts, then the sum), gauges.
Data = tuple[Counters, Hists, Gauges]

_LE = [*(repr(float(b)) for b in BUCKETS), "+Inf"]


def _le_key(raw: str) -> str:
    return "+Inf" if raw in ("+Inf", "Inf", "inf") else repr(float(raw))


def parse(text: str) -> Data:
    """Our metrics in a textfile, as counts (histogram buckets not cumulative)."""
    counters: Counters = {n: {} for n in COUNTERS}
    hists: Hists = {n: {} for n in HISTOGRAMS}
    gauges: Gauges = {n: {} for n in GAUGES}
    for fam in text_string_to_metric_families(text):
        if fam.name in GAUGES:
            names = GAUGES[fam.name][1]
            for s in fam.samples:
                gauges[fam.name][tuple(s.labels.get(n, "") for n in names)] = s.value
        elif fam.name in COUNTERS:
            names = COUNTERS[fam.name][1]
            for s in fam.samples:
                if s.name == fam.name + "_total":
                    counters[fam.name][tuple(s.labels.get(n, "") for n in names)] = s.value
        elif fam.name in HISTOGRAMS:
            names = HISTOGRAMS[fam.name][1]
            cumulative: dict[Labels, dict[str, float]] = {}
            sums: dict[Labels, float] = {}
            for s in fam.samples:
                labels = tuple(s.labels.get(n, "") for n in names)
                if s.name.endswith("_bucket"):
                    cumulative.setdefault(labels, {})[_le_key(s.labels["le"])] = s.value
                elif s.name.endswith("_sum"):
                    sums[labels] = s.value
            for labels, by_le in cumulative.items():
                if set(by_le) != set(_LE):
                    log.warning("metrics textfile: %s%s has other buckets; restarted",
                                fam.name, labels)
                    continue
                counts, before = [], 0.0
                for le in _LE:
                    counts.append(by_le[le] - before)
                    before = by_le[le]
                hists[fam.name][labels] = [*counts, sums.get(labels, 0.0)]
    return counters, hists, gauges


def add(total: Data, delta: tuple[Counters, Hists]) -> Data:
    """``total`` plus ``delta`` (in place; gauges are not added, see :func:`replace`)."""
    counters, hists, _ = total
    for name, series in delta[0].items():
        into = counters.setdefault(name, {})
        for labels, v in series.items():
            into[labels] = into.get(labels, 0.0) + v
    for name, hseries in delta[1].items():
        hinto = hists.setdefault(name, {})
        for labels, h in hseries.items():
            old = hinto.get(labels)
            hinto[labels] = list(h) if old is None else [a + b for a, b in zip(old, h,
                                                                               strict=True)]
    return total


class _Collector:
    def __init__(self, data: Data) -> None:
        self.data = data

    def collect(self) -> Iterator[Metric]:
        counters, hists, gauges = self.data
        for name, (doc, names) in GAUGES.items():
            gfam = GaugeMetricFamily(name, doc, labels=list(names))
            for labels, v in sorted(gauges.get(name, {}).items()):
                gfam.add_metric(list(labels), v)
            yield gfam
        for name, (doc, names) in COUNTERS.items():
            fam = CounterMetricFamily(name, doc, labels=list(names))
            for labels, v in sorted(counters.get(name, {}).items()):
                fam.add_metric(list(labels), v)
            yield fam
        for name, (doc, names) in HISTOGRAMS.items():
            hfam = HistogramMetricFamily(name, doc, labels=list(names))
            for labels, h in sorted(hists.get(name, {}).items()):
                running, buckets = 0.0, []
                for le, c in zip(_LE, h[:-1], strict=True):
                    running += c
                    buckets.append((le, running))
                hfam.add_metric(list(labels), buckets, h[-1])
            yield hfam

    def describe(self) -> list[Metric]:
        return []


def registry_of(data: Data) -> CollectorRegistry:
    """A registry that exposes ``data`` (for ``generate_latest`` or a textfile)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(data))
    return reg


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(str(path) + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def merge_into(path: Path, metrics: Metrics,
               gauges: tuple[str, Gauges] | None = None) -> None:
    """Add ``metrics``' deltas to the textfile at ``path`` (created if missing); ``gauges``
    (ledger label, series) replace that ledger's gauges."""
    delta = metrics.take()
    if not any(delta[0].values()) and not any(delta[1].values()) and path.exists() \
            and gauges is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        try:
            total = parse(text)
        except Exception:     # a damaged file: start again rather than stop counting
            log.warning("metrics textfile %s could not be parsed; it starts again", path)
            total = parse("")
        add(total, delta)
        if gauges is not None:
            replace(total[2], gauges[1], gauges[0])
        write_to_textfile(str(path), registry_of(total))
    os.chmod(path, 0o644)


def with_gauges(text: str, ledger: str, gauges: Gauges) -> bytes:
    """The textfile ``text`` with ``ledger``'s gauges replaced by ``gauges``, as served."""
    data = parse(text)
    replace(data[2], gauges, ledger)
    return generate_latest(registry_of(data))
