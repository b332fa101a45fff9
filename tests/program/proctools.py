"""Process probes shared by the program-task tests."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

PY = sys.executable


def roles(path: Path) -> dict[str, int]:
    """``{role: pid}`` from a stubborn.py pid file."""
    if not path.exists():
        return {}
    return {role: int(pid) for role, pid in
            (line.split() for line in path.read_text().splitlines() if line.strip())}


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has stopped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def kill_all(pids: dict[str, int]) -> None:
    """Clean up after a failed test."""
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
