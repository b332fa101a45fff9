"""A problem found in a declarative spec: where it is, what it is, and how to fix it.

Every check of a spec (:mod:`ledgerflow.specs.check`, :mod:`ledgerflow.specs.policy`)
reports :class:`Problem` objects, so ``pipeline validate --json`` prints them
as they are and a drafting model gets the same objects back to repair its
draft. ``path`` points into the spec (``tasks.load.args.rows``,
``tasks.load.after[0]``); ``code`` is stable (``arg.type``, ``graph.cycle``,
``policy.write``...; the list is in ``docs/drafts.md``); a ``note`` is not an
error (a step that will wait for approval).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

ERROR: Final = "error"
NOTE: Final = "note"


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One problem (or note) at ``path`` in a spec.

    Example:
        >>> p = Problem(path="tasks.load.args.rows", code="arg.type",
        ...             message="rows is a string; load takes int", hint="rows = 10")
        >>> p.as_dict()["path"], str(p)
        ('tasks.load.args.rows', 'tasks.load.args.rows: rows is a string; load takes int')
    """

    path: str
    code: str
    message: str
    hint: str = ""
    severity: Literal["error", "note"] = ERROR

    def as_dict(self) -> dict[str, str]:
        """``{path, code, message, hint}``: the form ``--json`` prints and models read."""
        return {"path": self.path, "code": self.code, "message": self.message,
                "hint": self.hint}

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def step_path(key: str, *parts: str | int) -> str:
    """``tasks.KEY.part...``, with list positions as ``[i]`` and odd keys quoted.

    Example:
        >>> step_path("load", "after", 0), step_path("my step", "args", "rows")
        ('tasks.load.after[0]', 'tasks."my step".args.rows')
    """
    out = "tasks." + _key(key)
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else "." + _key(p)
    return out


def _key(name: str) -> str:
    if name and all(c.isalnum() or c in "_-" for c in name):
        return name
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
