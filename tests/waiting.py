"""Polling with a deadline, for tests that wait on another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T], *, timeout: float = 30.0,
               what: str | Callable[[], object] = "", every: float = 0.02) -> T:
    """Call ``probe`` until it returns something truthy; return that, or fail the test.

    ``timeout`` only detects a hang. ``what`` names what was awaited in the failure;
    a callable is called then, to show the state at that moment (a log, the rows).
    """
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= end:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {said or probe}")
        time.sleep(every)
