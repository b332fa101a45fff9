"""Who is deciding an approval request: from a source the approver cannot just claim.

* By default the decider is the **OS user running the process**, read from the
  kernel (``os.getuid`` and the password database), never from ``$USER``.
* ``--as NAME`` (``by=`` in Python) is accepted only where the **approvers
  mapping** allows it: a file (``LEDGERFLOW_APPROVERS``, default
  ``/etc/ledgerflow/approvers``) of ``osuser: name, other`` lines. The first
  name is the OS user's approver name (its default), the others are names it
  may decide as (delegation). A mapping file writable by group or others is
  ignored. The superuser may decide as anyone: it can write the ledger anyway.
* The console (one process, many people) identifies each approver by a
  **per-approver token** (:func:`from_token`): a file
  (``LEDGERFLOW_APPROVER_TOKENS``) of ``name: sha256-of-token`` lines. The
  console reads the token from the request (``Authorization: Bearer ...``),
  calls :func:`from_token` and passes the :class:`Verified` name as ``by=``;
  a plain string ``by=`` is a claim and goes through :func:`decider`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import stat
from pathlib import Path

from .errors import InputError

#: Where the approvers mapping is read from when ``LEDGERFLOW_APPROVERS`` is unset.
DEFAULT_MAPPING = "/etc/ledgerflow/approvers"


class Verified(str):
    """An approver name established by this module (OS user, mapping or token), not claimed."""

    __slots__ = ()


def os_user(uid: int | None = None) -> str:
    """The name of the OS user running this process (from the kernel's uid)."""
    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:        # a uid with no entry (containers): still someone
        return f"uid{uid}"


def _lines(path: Path) -> list[tuple[str, list[str]]]:
    """``left: a, b`` lines of a protected file (missing or unprotected: none)."""
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return []       # anyone could have written it: not a source of identity
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if ":" in line:
            left, right = line.split(":", 1)
            names = [n.strip() for n in right.split(",") if n.strip()]
            if left.strip() and names:
                out.append((left.strip(), names))
    return out


def mapping() -> dict[str, list[str]]:
    """OS user -> the approver names it may decide as (its own name first)."""
    path = Path(os.environ.get("LEDGERFLOW_APPROVERS") or DEFAULT_MAPPING)
    found: dict[str, list[str]] = {}
    for user, names in _lines(path):
        found.setdefault(user, []).extend(names)
    return found


def names_of(user: str) -> list[str]:
    """The approver names the OS user ``user`` may decide as (its default first)."""
    return mapping().get(user) or [user]


def decider(claimed: str | None = None, *, uid: int | None = None) -> Verified:
    """The name a decision is recorded under: the OS user's approver name, or ``claimed``
    if the mapping allows this OS user to decide as it.

    Raises:
        InputError: ``claimed`` is not a name this OS user may decide as.
    """
    if isinstance(claimed, Verified):
        return claimed
    uid = os.getuid() if uid is None else uid
    user = os_user(uid)
    names = names_of(user)
    if not claimed:
        return Verified(names[0])
    if claimed == user or claimed in names or uid == 0:
        return Verified(claimed)
    raise InputError(
        f"OS user {user!r} may not decide as {claimed!r} (it decides as "
        f"{', '.join(map(repr, names))})",
        hint="drop --as to decide as yourself, or have an administrator map "
        f"'{user}: {names[0]}, {claimed}' in the approvers file "
        f"(LEDGERFLOW_APPROVERS, default {DEFAULT_MAPPING})")


def token_hash(token: str) -> str:
    """What the tokens file holds for ``token`` (its SHA-256, hex)."""
    return hashlib.sha256(token.encode()).hexdigest()


def from_token(token: str) -> Verified | None:
    """The approver a console token belongs to (``LEDGERFLOW_APPROVER_TOKENS``); None if
    no approver has it."""
    raw = os.environ.get("LEDGERFLOW_APPROVER_TOKENS")
    if not raw or not token:
        return None
    got = token_hash(token)
    for name, hashes in _lines(Path(raw)):
        if any(hmac.compare_digest(got, h.lower()) for h in hashes):
            return Verified(name)
    return None
