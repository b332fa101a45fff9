"""The benchmark's table: each figure with its baseline from the same run, and the statistics.

Every ratio a target is read against is measured side by side, in one run of
``python -m tests.perf``; :class:`Table` prints each figure as it comes and
keeps the rows for the JSON file.
"""

from __future__ import annotations

from typing import Any


class Table:
    """The figures of one benchmark run, each with its baseline and the ratio to it."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, figure: str, value: float, unit: str, *, baseline: str = "",
            base: float | None = None, target: str = "-", diff: bool = False) -> None:
        """One figure; ``base``: the baseline's value in the same run (``diff``: show
        ``value - base`` instead of the ratio)."""
        ratio = None
        shown = ""
        if base:
            if diff:
                ratio = value - base
                shown = f"{ratio:+.3f} {unit}"
            else:
                ratio = value / base
                shown = f"{ratio:.2f}x"
        self.rows.append({"figure": figure, "value": round(value, 3), "unit": unit,
                          "baseline": baseline, "baseline_value":
                          None if base is None else round(base, 3),
                          "ratio": None if ratio is None else round(ratio, 3),
                          "target": target})
        print(f"{figure:<58} {shown:>10}  {value:>11.3f} {unit:<3} "
              f"{'vs ' + baseline if baseline else '':<34} target {target}", flush=True)


def slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fit of seconds = fixed + per_task * n; returns (per_task us, fixed s)."""
    k = len(points)
    mx = sum(n for n, _ in points) / k
    my = sum(t for _, t in points) / k
    b = sum((n - mx) * (t - my) for n, t in points) / sum((n - mx) ** 2 for n, _ in points)
    return b * 1e6, my - b * mx


def median(xs: list[float]) -> float:
    """The middle value (the upper one of an even count)."""
    xs = sorted(xs)
    return xs[len(xs) // 2]
