"""Talking to the database: connecting, masking URLs, and waiting out an outage.

:class:`Database` owns the URL and the bound on waiting. Every operation of
the store goes through :meth:`Database.retrying`: a connection error (the
server stopped, restarted, or is still recovering) closes the connection,
says so once on the ``ledgerflow`` logger, and tries again with backoff
(50 ms doubling to 1 s) until the server is back or ``wait`` seconds have
passed, then raises :class:`StoreUnavailableError`. Errors that waiting
cannot fix (a wrong password, a database that does not exist) are raised at
once as :class:`~ledgerflow.errors.StoreError`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ledgerflow.errors import LeaseLostError, StoreError

log = logging.getLogger("ledgerflow")
T = TypeVar("T")

#: Seconds an operation waits for the database to come back (LEDGERFLOW_STORE_WAIT).
DEFAULT_WAIT = 20.0


class StoreUnavailableError(StoreError):
    """The database did not answer within the configured wait."""

    exit_code = 1


def mask(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    return re.sub(r"(://[^:/@]+:)[^@/]*@", r"\1***@", url)


def _transient(exc: BaseException) -> bool:
    """True for errors that may go away when the server is back."""
    import psycopg
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None) or ""
    # authentication (28...) and a missing database (3D000) do not heal by waiting;
    # a failed connect carries no SQLSTATE, only the server's message
    if state.startswith("28") or state == "3D000":
        return False
    text = str(exc)
    return not any(m in text for m in _PERMANENT)


#: What the server says when connecting cannot work however long one waits.
_PERMANENT = ("does not exist", "password authentication failed", "no pg_hba.conf entry",
              "authentication failed", "invalid port", "invalid connection option",
              "missing \"=\"", "invalid URI")


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` is a lost or refused connection (waiting may help)."""
    return _transient(exc)


class Database:
    """One PostgreSQL database: its URL, how to connect, how long to wait for it."""

    def __init__(self, url: str, *, wait: float = DEFAULT_WAIT) -> None:
        self.url = url
        self.wait = wait
        self.shown = mask(url)
        self._outage_lock = threading.Lock()

    def connect(self, *, timeout: float | None = None) -> Any:
        """A new autocommit connection (raises psycopg errors)."""
        import psycopg
        t = max(1, int(min(self.wait, 5.0) if timeout is None else timeout))
        return psycopg.connect(self.url, autocommit=True, connect_timeout=t,
                               application_name="ledgerflow")

    def retrying(self, attempt: Callable[[bool], T], *, what: str,
                 reset: Callable[[], None] = lambda: None,
                 fenced: Callable[[], str | None] | None = None,
                 hint: str | None = None, wait: float | None = None) -> T:
        """Call ``attempt(retry)`` until it does not fail with a connection error.

        ``retry`` is True from the second call on (the caller checks what
        landed before sending again). ``reset`` drops the broken connection;
        ``fenced`` says why this driver must stop (then LeaseLostError).

        Raises:
            StoreUnavailableError: the database stayed away for ``wait`` seconds.
            StoreError: an error that waiting cannot fix.
        """
        bound = self.wait if wait is None else wait
        started: float | None = None
        delay = 0.05
        retry = False
        while True:
            try:
                result = attempt(retry)
            except Exception as exc:
                if not _transient(exc):
                    if _is_connect_refusal(exc):
                        raise StoreError(f"cannot use the database {self.shown}: "
                                         f"{_first_line(exc)}",
                                         hint="check the URL's user and database, and the "
                                         "password in PGPASSWORD or ~/.pgpass") from exc
                    raise
                reset()
                now = time.monotonic()
                if started is None:
                    started = now
                    log.warning("ledgerflow: database %s unreachable while %s (%s); "
                                "waiting up to %gs for it (LEDGERFLOW_STORE_WAIT)",
                                self.shown, what, _first_line(exc), bound)
                if fenced is not None:
                    reason = fenced()
                    if reason is not None:
                        raise LeaseLostError(f"lease lost: {reason}") from exc
                if now - started >= bound:
                    raise StoreUnavailableError(
                        f"store unavailable: database {self.shown} did not answer for "
                        f"{now - started:.0f}s while {what} ({_first_line(exc)})",
                        hint=hint or "start the database (or raise LEDGERFLOW_STORE_WAIT), "
                        "then run the command again") from exc
                time.sleep(min(delay, max(0.0, started + bound - now)))
                delay = min(delay * 2, 1.0)
                retry = True
                continue
            if started is not None:
                log.warning("ledgerflow: database %s is back after %.1fs", self.shown,
                            time.monotonic() - started)
            return result


def _is_connect_refusal(exc: BaseException) -> bool:
    import psycopg
    return isinstance(exc, psycopg.OperationalError)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
