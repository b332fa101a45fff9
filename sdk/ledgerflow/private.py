"""Ledger data only its user reads: folders created 0700, files created 0600.

What a ledger keeps (its file, journals, decisions, step and call logs, result
files) may hold secrets a task saw, so whatever ledgerflow creates is private
to the user, whatever the umask. What exists already keeps its mode: a team
that opened a ledger to its group on purpose keeps it that way.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_dirs(folder: str | os.PathLike[str]) -> None:
    """Create ``folder`` and every missing folder above it, each 0700 (``mkdir -p``
    gives the parents the umask's mode); existing ones are left as they are."""
    p = Path(folder)
    if p.is_dir():
        return
    missing = []
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
    if not Path(folder).is_dir():
        raise NotADirectoryError(f"not a folder: {folder}")


def open_file(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags)``, a file it creates being 0600."""
    return os.open(path, flags, FILE_MODE)


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` (created 0600, or truncated)."""
    fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def restrict(path: str | os.PathLike[str]) -> None:
    """Make a file a library created with the umask's mode (DuckDB, pyarrow) 0600."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, FILE_MODE)
