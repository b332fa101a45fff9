"""Resource limits of a program (rlimits), and which limit a failed program hit."""

from __future__ import annotations

import math
import re
import signal
from dataclasses import dataclass

__all__ = ["Limits", "limit_hit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Resource limits applied with ``setrlimit`` in the program's process.

    Each limit is inherited by the program's children (each process gets its
    own budget; ``processes`` counts all processes of the user and is not
    enforced for root).

    Attributes:
        cpu_s: CPU seconds (SIGXCPU at the limit, SIGKILL one second later).
        memory_mb: address space (``RLIMIT_AS``) in MiB; allocations beyond fail.
        open_files: file descriptors (``RLIMIT_NOFILE``).
        processes: processes of the user (``RLIMIT_NPROC``).
        file_size_mb: largest file the program may write, in MiB (SIGXFSZ).
    """

    cpu_s: float | None = None
    memory_mb: float | None = None
    open_files: int | None = None
    processes: int | None = None
    file_size_mb: float | None = None

    def rlimits(self) -> list[tuple[str, int, int]]:
        """``(RLIMIT_NAME, soft, hard)`` for each limit set."""
        out: list[tuple[str, int, int]] = []
        if self.cpu_s is not None:
            soft = max(1, math.ceil(self.cpu_s))
            out.append(("RLIMIT_CPU", soft, soft + 1))
        if self.memory_mb is not None:
            out.append(("RLIMIT_AS", int(self.memory_mb * 2**20), int(self.memory_mb * 2**20)))
        if self.open_files is not None:
            out.append(("RLIMIT_NOFILE", self.open_files, self.open_files))
        if self.processes is not None:
            out.append(("RLIMIT_NPROC", self.processes, self.processes))
        if self.file_size_mb is not None:
            size = int(self.file_size_mb * 2**20)
            out.append(("RLIMIT_FSIZE", size, size))
        return out


_MEMORY = re.compile(r"MemoryError|Cannot allocate memory|out of memory|bad_alloc|ENOMEM",
                     re.IGNORECASE)
_NOFILE = re.compile(r"Too many open files|EMFILE")
_NPROC = re.compile(r"Resource temporarily unavailable|EAGAIN|fork", re.IGNORECASE)
_FSIZE = re.compile(r"File too large|EFBIG")


def limit_hit(limits: Limits | None, sig: int | None, cpu: float, stderr: str) -> str | None:
    """Which limit made a failed program fail, if one did."""
    if limits is None:
        return None
    if limits.cpu_s is not None and (sig == signal.SIGXCPU or (
            sig == signal.SIGKILL and cpu >= max(1, math.ceil(limits.cpu_s)) - 0.05)):
        return "cpu_s"
    if limits.file_size_mb is not None and (sig == signal.SIGXFSZ or _FSIZE.search(stderr)):
        return "file_size_mb"
    if limits.memory_mb is not None and _MEMORY.search(stderr):
        return "memory_mb"
    if limits.open_files is not None and _NOFILE.search(stderr):
        return "open_files"
    if limits.processes is not None and _NPROC.search(stderr):
        return "processes"
    return None
