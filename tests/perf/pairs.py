"""Interleaved A/B timing of whole commands: ``python -m tests.perf.pairs N LABEL CMD ...``.

One process moves by tens of milliseconds from run to run on a loaded
two-core machine, so two separate series of a command cannot resolve a change
of that size. This runs each command once per round, ``N`` rounds, and
alternates which one goes first. It prints per command the median and the
minimum wall time, and the CPU time (user + system) of the command's
processes. Commands run through ``bash -c``, so ``$RANDOM`` and ``$(...)``
work. Example (a tree before a change, checked out with ``git worktree add``,
against this one)::

    python -m tests.perf.pairs 15 \\
        before "PYTHONPATH=/tmp/base:/tmp/base/sdk:/tmp/base/plugins python -m ledgerflow status R" \\
        after  "python -m ledgerflow status R" \\
        pass   "python -c pass"

Never part of the test suite.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time


def _once(cmd: str) -> tuple[float, float]:
    """(wall ms, CPU ms of its processes) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(["bash", "-c", cmd], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    wall = (time.perf_counter() - t) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{cmd!r} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3
    return wall, cpu


def main(argv: list[str]) -> None:
    if len(argv) < 3 or len(argv) % 2 == 0 or not argv[0].isdigit():
        raise SystemExit("usage: python -m tests.perf.pairs N LABEL CMD [LABEL CMD]...")
    rounds = int(argv[0])
    pairs = list(zip(argv[1::2], argv[2::2], strict=True))
    walls: dict[str, list[float]] = {label: [] for label, _ in pairs}
    cpus: dict[str, list[float]] = {label: [] for label, _ in pairs}
    for i in range(rounds):
        for label, cmd in pairs if i % 2 == 0 else pairs[::-1]:
            wall, cpu = _once(cmd)
            walls[label].append(wall)
            cpus[label].append(cpu)
    width = max(len(label) for label, _ in pairs)
    for label, _ in pairs:
        w, c = walls[label], cpus[label]
        print(f"{label:>{width}}: wall median {statistics.median(w):6.0f} ms (min {min(w):4.0f}), "
              f"CPU median {statistics.median(c):6.0f} ms, {rounds} rounds")


if __name__ == "__main__":
    main(sys.argv[1:])
