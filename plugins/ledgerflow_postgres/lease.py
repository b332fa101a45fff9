"""Run leases on the server's clock, the keeper that renews them, and driver signals.

A lease row (``leases``) names the driving process and its fencing token and
expires at ``expires_at``, set with the **server's** ``now()`` so drivers on
machines with different clocks agree. :class:`Keeper` is one thread per
store with its own connection: it renews every held lease every third of
its time to live, listens for ``NOTIFY ledgerflow_signals`` and also polls
the ``signals`` table every second (notifications sent while it was
disconnected are lost): cancel requests and approval decisions, which the
runner then reads from memory.

Self-fencing. A lease counts as lost locally once the driver has gone
``ttl`` (less a small margin) since it *sent* its last successful renewal,
measured on this process's monotonic clock: the server's lease cannot have
expired earlier than that, so the driver stops before anyone can take
over. A renewal that finds another token means the run was taken over.
Either way :meth:`Keeper.lost` gives the reason; the store refuses further
commits and the runner stops (``ledgerflow.runner.Runner._check_lease``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ledgerflow.procs import proc_start
from ledgerflow.store import Lease

from .connection import Database, is_connection_error

log = logging.getLogger("ledgerflow")

#: Lease time to live in seconds (LEDGERFLOW_LEASE_TTL).
DEFAULT_TTL = 30.0
#: Seconds between polls of the signals table (besides NOTIFY).
SIGNAL_POLL = 1.0
SIGNALS_CHANNEL = "ledgerflow_signals"
RUNS_CHANNEL = "ledgerflow_runs"


@dataclass(frozen=True)
class Claim:
    """A run a worker claimed (:meth:`PostgresStore.claim`): its lease, and the pid of
    the driver on this host whose death let it be taken over before its lease expired
    (None: it was submitted, or its lease had expired)."""

    lease: Lease
    dead_pid: int | None = None

    def why(self) -> str:
        """What the worker says of the claim (after ``claimed (token N)``)."""
        if self.dead_pid is None:
            return ""
        return f": its driver (pid {self.dead_pid} on this host) is gone"


def holder() -> tuple[int, str, str | None]:
    """(pid, host, pid start time) of this process, as a lease row names it."""
    pid = os.getpid()
    return pid, socket.gethostname(), proc_start(pid)


def holder_gone(pid: int | None, host: str | None, start: str | None) -> bool:
    """True if the lease holder is a process on this host that is not running any more
    (with the same start time: a reused pid is not mistaken for it)."""
    if pid is None or host != socket.gethostname() or not os.path.isdir("/proc"):
        return False
    now = proc_start(pid)
    return now is None or (start is not None and now != start)


@dataclass(slots=True)
class Held:
    """A lease this process holds."""

    token: int
    deadline: float          # monotonic: lost at this time unless renewed
    next_renew: float
    lost: str | None = None
    cancel: bool = False
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)   # by digest
    polled: bool = False     # the signals table was read since the lease was taken


class Keeper:
    """Renews this store's leases and watches their signals (see the module docstring)."""

    def __init__(self, db: Database, ttl: float) -> None:
        self.db = db
        self.ttl = ttl
        self.margin = min(0.5, ttl * 0.1)
        self.held: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._conn: Any = None

    # -- what the store asks ------------------------------------------------------------
    def hold(self, run_id: str, token: int, sent: float) -> None:
        """Start renewing ``run_id``'s lease ``token``, acquired by a statement sent at
        ``sent`` (monotonic)."""
        with self._lock:
            self.held[run_id] = Held(token, sent + self.ttl - self.margin,
                                     sent + self.ttl / 3)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="ledgerflow-pg-keeper")
                self._thread.start()

    def drop(self, run_id: str) -> Held | None:
        """Stop renewing ``run_id``'s lease; return what was held."""
        with self._lock:
            return self.held.pop(run_id, None)

    def lost(self, run_id: str, token: int) -> str | None:
        """Why the lease ``(run_id, token)`` is lost, or None while it holds."""
        h = self.held.get(run_id)
        if h is None or h.token != token:
            return None
        if h.lost is None and time.monotonic() > h.deadline:
            h.lost = (f"could not renew the lease of run {run_id} for {self.ttl:g}s (the "
                      "database was unreachable or this process was paused); another "
                      "driver may take it over, so this one stopped")
        return h.lost

    def cancelled(self, run_id: str) -> bool | None:
        """True once a cancel was signalled for a held run (None: not held here)."""
        h = self.held.get(run_id)
        return None if h is None else h.cancel

    def mark_cancel(self, run_id: str) -> None:
        h = self.held.get(run_id)
        if h is not None:
            h.cancel = True

    def decisions(self, run_id: str) -> list[dict[str, Any]] | None:
        """Approval decisions signalled for a held run (None: not held here, or not
        polled yet since the lease was taken: the caller reads the table itself, so a
        decision made before this driver started is never missed)."""
        h = self.held.get(run_id)
        return None if h is None or not h.polled else list(h.decisions.values())

    def add_decision(self, run_id: str, doc: dict[str, Any]) -> None:
        h = self.held.get(run_id)
        if h is not None:
            h.decisions.setdefault(doc["digest"], doc)

    def close(self) -> None:
        """Stop the thread (leases are not released: the store does that)."""
        self._stop.set()     # the thread closes its connection within half a second

    # -- the thread -----------------------------------------------------------------------
    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self) -> None:
        next_poll = 0.0
        delay = 0.05
        while not self._stop.is_set():
            with self._lock:
                if not self.held:
                    self._thread = None
                    break
            try:
                if self._conn is None:
                    self._conn = self.db.connect(timeout=min(5.0, max(1.0, self.ttl / 3)))
                    self._conn.execute(f"LISTEN {SIGNALS_CHANNEL}")
                    next_poll = 0.0
                    delay = 0.05
                now = time.monotonic()
                for run_id, h in list(self.held.items()):
                    if h.lost is None and now >= h.next_renew:
                        self._renew(run_id, h)
                if now >= next_poll:
                    self._poll()
                    next_poll = time.monotonic() + SIGNAL_POLL
                due = min([h.next_renew for h in self.held.values() if h.lost is None]
                          + [next_poll])
                timeout = max(0.01, min(0.5, due - time.monotonic()))
                # no query while the generator holds the connection: collect, then poll
                notes = list(self._conn.notifies(timeout=timeout, stop_after=1))
                if any(n.payload in self.held for n in notes):
                    self._poll()
                    next_poll = time.monotonic() + SIGNAL_POLL
            except Exception as exc:
                if not is_connection_error(exc):
                    log.warning("ledgerflow: lease keeper error: %s", exc, exc_info=True)
                self._drop_conn()
                # renewals fail meanwhile: lost() fences by the deadline on its own
                self._stop.wait(delay)
                delay = min(delay * 2, 1.0)
        self._drop_conn()

    def _renew(self, run_id: str, h: Held) -> None:
        if self.lost(run_id, h.token) is not None:
            return          # past the deadline: never extend a lease that may be gone
        sent = time.monotonic()
        row = self._conn.execute(
            "UPDATE leases SET renewed_at = now(), "
            "expires_at = now() + make_interval(secs => %s) "
            "WHERE run_id = %s AND token = %s RETURNING 1",
            [self.ttl, run_id, h.token]).fetchone()
        if row is not None:
            h.deadline = sent + self.ttl - self.margin
            h.next_renew = sent + self.ttl / 3
            return
        cur = self._conn.execute("SELECT token, host, pid FROM leases WHERE run_id = %s",
                                 [run_id]).fetchone()
        who = f"token {cur[0]} on {cur[1]} pid {cur[2]}" if cur else "nobody"
        h.lost = (f"run {run_id} was taken over by another driver ({who}); this "
                  f"driver's token {h.token} is stale, so it stopped without writing")

    def _poll(self) -> None:
        snap = dict(self.held)       # the leases held when the table is read
        runs = list(snap)
        if not runs:
            return
        rows = self._conn.execute(
            "SELECT run_id, kind, token, payload FROM signals WHERE run_id = ANY(%s) "
            "AND kind IN ('cancel', 'decision') ORDER BY id", [runs]).fetchall()
        for run_id, kind, token, payload in rows:
            h = self.held.get(run_id)
            if h is None:
                continue
            if kind == "cancel" and token is not None and token >= h.token:
                h.cancel = True
            elif kind == "decision" and payload:
                doc = json.loads(payload)
                h.decisions.setdefault(doc["digest"], doc)
        for h in snap.values():
            h.polled = True
