"""Process identity: is pid P (started at T) alive, and the table of processes by parent.

One answer for the whole tree: run leases (DuckDB, PostgreSQL), budget
reservations, program supervisors and the processes executor all ask here.
A process is named by its pid *and* its start time (field 22 of
``/proc/PID/stat``, in clock ticks since boot), so a reused pid is not
mistaken for the process that held it. A zombie is not alive.
"""

from __future__ import annotations

import os

__all__ = ["alive", "children_table", "pid_alive", "proc_start"]


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def proc_start(pid: int) -> str | None:
    """The start time of ``pid`` (from /proc), or None if it is not running."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode()


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (Linux, /proc)."""
    fields = _stat_fields(pid)
    return fields is not None and len(fields) > 0 and fields[0] not in (b"Z", b"X")


def pid_alive(pid: int, start: str | None = None) -> bool:
    """True if ``pid`` runs and, when ``start`` is given, started at ``start``.

    Without /proc (not Linux) the start time cannot be checked: a process we may
    not signal still counts as alive.
    """
    if os.path.isdir("/proc"):
        now = proc_start(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def children_table() -> tuple[dict[int, list[int]], set[int]]:
    """``(children by parent pid, live pids)`` from /proc (zombies are not live)."""
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return children, live
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if not fields or len(fields) < 2:
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        if fields[0] not in (b"Z", b"X"):
            live.add(pid)
    return children, live
