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
  **per-approver token** (:func:`from_token`): a file of ``name: sha256-of-token``
  lines (``pipeline console --approver-tokens FILE`` or
  ``LEDGERFLOW_APPROVER_TOKENS``), owned by the console's user and readable by
  nobody else (mode 0600: :func:`check_tokens_file` refuses anything else, with
  the fix). :func:`add_token` makes a fresh token and stores only its hash. The
  console reads the token from the request (``Authorization: Bearer ...``),
  calls :func:`from_token` and passes the :class:`Verified` name as ``by=``;
  a plain string ``by=`` is a claim and goes through :func:`decider`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import secrets
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


def tokens_path(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The approver tokens file: ``path``, else ``LEDGERFLOW_APPROVER_TOKENS``; None if neither."""
    raw = os.fspath(path) if path is not None else os.environ.get("LEDGERFLOW_APPROVER_TOKENS")
    return Path(raw) if raw else None


def check_tokens_file(path: Path) -> Path:
    """``path`` if it is a regular file of this user (or root) that nobody else may read.

    Raises:
        InputError: it is missing, not a regular file, another user's, or readable
            or writable by group or others (with the command that fixes it).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"approver tokens file {path} does not exist",
                         hint=f"make one with: pipeline console token --for NAME "
                         f"--approver-tokens {path}") from None
    except OSError as exc:
        raise InputError(f"cannot read approver tokens file {path}: {exc.strerror or exc}",
                         hint="check the path and its permissions") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"approver tokens file {path} is not a regular file",
                         hint="point --approver-tokens at a file")
    if st.st_uid not in (os.getuid(), 0):
        raise InputError(f"approver tokens file {path} belongs to uid {st.st_uid}, not to "
                         f"{os_user()!r} who runs the console",
                         hint=f"chown {os_user()} {path} (and chmod 600 {path})")
    if st.st_mode & 0o077:
        raise InputError(f"approver tokens file {path} is open to group or others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o})",
                         hint=f"chmod 600 {path}")
    return path


def _token_lines(path: Path) -> list[tuple[str, list[str]]]:
    check_tokens_file(path)
    return _lines(path)


def token_names(path: str | os.PathLike[str] | None = None) -> list[str]:
    """The approvers that have a token in the tokens file (checked as :func:`check_tokens_file`)."""
    found = tokens_path(path)
    return [] if found is None else list(dict.fromkeys(n for n, _ in _token_lines(found)))


def from_token(token: str, path: str | os.PathLike[str] | None = None) -> Verified | None:
    """The approver a console token belongs to; None if no approver has it (or no tokens
    file is configured). Every stored hash is compared, in constant time.

    Raises:
        InputError: the tokens file is missing or open to others (:func:`check_tokens_file`).
    """
    found = tokens_path(path)
    if found is None or not token:
        return None
    got = token_hash(token)
    name: str | None = None
    for who, hashes in _token_lines(found):
        for h in hashes:
            if hmac.compare_digest(got, h.lower()) and name is None:
                name = who
    return None if name is None else Verified(name)


def _valid_name(name: str) -> str:
    name = name.strip()
    if not name or any(c in name for c in ":,#") or not name.isprintable():
        raise InputError(f"{name!r} cannot be an approver name in the tokens file",
                         hint="use the name the gates list in approvers=[...], without "
                         "':', ',' or '#'")
    return name


def add_token(path: Path, name: str) -> str:
    """A fresh token for approver ``name``; only its SHA-256 is appended to ``path``
    (created with mode 0600 if missing). The token is returned once, never stored."""
    name = _valid_name(name)
    token = secrets.token_urlsafe(24)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        check_tokens_file(path)
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputError(f"cannot create approver tokens file {path}: "
                         f"{exc.strerror or exc}", hint="choose a path you may write") from None
    with os.fdopen(fd, "a", encoding="utf-8") as out:
        out.write(f"{name}: {token_hash(token)}\n")
    return token


def revoke_tokens(path: Path, name: str) -> int:
    """Remove every token of approver ``name`` from ``path``; how many lines went."""
    name = _valid_name(name)
    check_tokens_file(path)
    kept, gone = [], 0
    for raw in path.read_text(encoding="utf-8").splitlines(keepends=True):
        left = raw.split("#", 1)[0].split(":", 1)[0].strip()
        if ":" in raw.split("#", 1)[0] and left == name:
            gone += 1
        else:
            kept.append(raw)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.writelines(kept)
    os.replace(tmp, path)
    return gone
