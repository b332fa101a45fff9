"""The process tree of program tasks: descendants of a pid, and which pids are supervisors.

Built on :mod:`ledgerflow.procs`; the processes executor uses the same
helpers to stop a worker's tree while leaving a program's supervisor (which
stops its own tree) alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from ..procs import alive, children_table

__all__ = ["SUPERVISOR_MARK", "alive", "descendants", "forget", "is_supervisor", "register",
           "supervisor_pids"]

#: An argv element of every supervisor: find supervisors by their command line.
SUPERVISOR_MARK = "--ledgerflow-program-supervisor"

_SUPERVISORS: dict[int, None] = {}
_LOCK = threading.Lock()


def descendants(root: int, *, prune: Iterable[int] = ()) -> list[int]:
    """Live descendants of ``root`` (not ``root`` itself), parents before children.

    Processes in ``prune`` and everything below them are left out.
    """
    children, live = children_table()
    skip = set(prune)
    out: list[int] = []
    todo = deque(children.get(root, ()))
    seen = {root}
    while todo:
        pid = todo.popleft()
        if pid in seen or pid in skip:
            continue
        seen.add(pid)
        if pid in live:
            out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def is_supervisor(pid: int) -> bool:
    """True if ``pid`` is a program supervisor (found by the marker in its argv)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return SUPERVISOR_MARK.encode() + b"\x00" in fh.read()
    except OSError:
        return False


def register(pid: int) -> None:
    """Note a supervisor this process started."""
    with _LOCK:
        _SUPERVISORS[pid] = None


def forget(pid: int) -> None:
    """Drop a supervisor that has exited."""
    with _LOCK:
        _SUPERVISORS.pop(pid, None)


def supervisor_pids() -> list[int]:
    """Pids of the program supervisors this process has running."""
    with _LOCK:
        return list(_SUPERVISORS)
