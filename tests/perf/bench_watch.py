"""Save-to-searchable latency of ``pipeline watch`` on the bundled corpus.

    python tests/perf/bench_watch.py [--embedders hashing minilm] [--debounce 0.5s 2s]
                                     [--rounds 5]

For each embedder and debounce: copy the bundled corpus to a fresh folder, start
``pipeline watch`` on the doc-index recipe, wait for its catch-up run, then
``--rounds`` times append a sentence with a word of its own to a Markdown file
and time from the save to the end of the run that covered it; the word is then
searched for in the index (keyword search), so "searchable" is checked, not assumed.
Prints min / median / max and the run's own share (the rest is the debounce).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

import duckdb  # noqa: E402

from tests.watch.helpers import DOC_INDEX, Watcher  # noqa: E402

CORPUS = ROOT / "recipes" / "doc_index" / "corpus"


def one(embedder: str, debounce: str, rounds: int) -> tuple[list[float], list[float], float]:
    """(save-to-searchable seconds, run seconds) of ``rounds`` edits, and the seconds of
    the catch-up run (the whole corpus)."""
    from ledgerflow_docindex.search import search

    folder = Path(tempfile.mkdtemp(prefix="lf-bench-watch-"))
    src = folder / "src"
    shutil.copytree(CORPUS, src)
    target = sorted(src.rglob("*.md"))[0]
    index = folder / "index.duckdb"
    w = Watcher(folder, str(DOC_INDEX), "-p", f"source={src}", "-p", f"index={index}",
                "-p", f"embedder={embedder}", "--debounce", debounce)
    latencies: list[float] = []
    runs: list[float] = []
    try:
        first = w.next_end(timeout=600)
        assert first["state"] == "succeeded", first
        with duckdb.connect(str(index), read_only=True) as con:   # the embedder asked for
            names = {str(v) for row in con.execute("SELECT * FROM meta").fetchall()
                     for v in row}
        assert any(embedder in n for n in names), (embedder, names)
        for _ in range(rounds):
            word = "zq" + uuid.uuid4().hex[:10]
            time.sleep(1.0)                         # apart from the previous run
            saved = time.monotonic()
            with open(target, "a") as fh:
                fh.write(f"\n\nA sentence that names {word} once.\n")
            want = str(target.resolve())
            while True:
                end = w.next_end(timeout=600)
                if want in end["trigger"].get("paths", []):
                    break
            latencies.append(time.monotonic() - saved)
            assert end["state"] == "succeeded", end
            runs.append(float(end.get("seconds") or 0.0))
            hits = search(str(index), word, k=1, mode="keyword")
            assert hits and target.name in f"{hits[0].doc_id} {hits[0].source}", (word, hits)
    finally:
        w.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return latencies, runs, float(first.get("seconds") or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--embedders", nargs="+", default=["hashing", "minilm"])
    ap.add_argument("--debounce", nargs="+", default=["0.5s", "2s"])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}; bundled corpus: "
          f"{sum(1 for p in CORPUS.rglob('*') if p.is_file())} files", flush=True)
    for embedder in args.embedders:
        for debounce in args.debounce:
            lat, runs, catch_up = one(embedder, debounce, args.rounds)
            run_part = (f"; run {statistics.median(runs):.2f} s median" if any(runs)
                        else "")
            print(f"{embedder:<8} debounce {debounce:<5} save-to-searchable "
                  f"{min(lat):.2f} / {statistics.median(lat):.2f} / {max(lat):.2f} s "
                  f"(min / median / max of {len(lat)}){run_part}; catch-up run "
                  f"{catch_up:.1f} s", flush=True)


if __name__ == "__main__":
    main()
