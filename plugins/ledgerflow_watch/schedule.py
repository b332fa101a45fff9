"""When scheduled runs are due: ``--every 10m`` and ``--cron "0 * * * *"``, and durations.

Missed slots. A watcher runs once when it starts (a catch-up run, cheap
because unchanged tasks are cache hits), never once per slot it missed while
it was down. Slots that pass while a run is going are not queued either: after
each run the next run is at the first slot still ahead, and the run that
follows records how many slots were skipped (``missed`` in its trigger).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ledgerflow.errors import InputError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str, what: str = "--every") -> float:
    """``"500ms"``, ``"2s"``, ``"10m"``, ``"1h"``, ``"1d"`` or plain seconds, in seconds."""
    m = _DURATION.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise InputError(f"{what}: not a duration: {text!r}",
                         hint=f"e.g. {what} 2s, {what} 10m or {what} 500ms")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A fixed interval (``every`` seconds, anchored at the watcher's start) or a cron
    expression (five fields, or six with seconds first... as croniter reads them)."""

    kind: str               # "every" or "cron"
    every: float = 0.0
    cron: str = ""
    anchor: float = 0.0     # epoch seconds the interval counts from

    @classmethod
    def every_(cls, text: str, anchor: float | None = None) -> Schedule:
        return cls("every", every=parse_duration(text),
                   anchor=time.time() if anchor is None else anchor)

    @classmethod
    def cron_(cls, expr: str) -> Schedule:
        from croniter import croniter
        if not croniter.is_valid(expr):
            raise InputError(f"--cron: not a cron expression: {expr!r}",
                             hint='e.g. --cron "0 * * * *" (hourly) or "*/5 * * * *"')
        return cls("cron", cron=expr)

    def next_after(self, t: float) -> float:
        """The first slot strictly after ``t`` (epoch seconds)."""
        if self.kind == "every":
            n = int((t - self.anchor) // self.every) + 1
            return self.anchor + n * self.every
        from croniter import croniter
        return float(croniter(self.cron, t).get_next(float))

    def missed(self, last: float, slot: float) -> int:
        """How many slots lie strictly between ``last`` and ``slot`` (skipped, not run)."""
        count, t = 0, self.next_after(last)
        while t < slot and count < 10_000:
            count += 1
            t = self.next_after(t)
        return count

    def describe(self) -> str:
        return f"every {self.every:g}s" if self.kind == "every" else f"cron {self.cron!r}"
