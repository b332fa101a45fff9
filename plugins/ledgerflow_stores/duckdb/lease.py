"""Run leases: who drives a run, the heartbeat that renews it, and liveness checks.

``<ledger>.d/runs/<run>/lease`` names the driving pid, its start time, the
host, the fencing token and a heartbeat, renewed every second by
:class:`Heartbeat`. A driver on this host is alive while its pid runs with
the same start time (a reused pid is not mistaken for it); on another host,
while its heartbeat is fresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerflow import private
from ledgerflow.procs import pid_alive, proc_start

#: A lease from another host counts as alive this long after its last heartbeat.
REMOTE_TTL = 10.0


class Leases:
    """The lease files of one ledger."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def run_dir(self, run_id: str) -> Path:
        return self.folder / run_id

    def write(self, run_id: str, token: int) -> None:
        d = self.run_dir(run_id)
        private.make_dirs(d)
        pid = os.getpid()
        doc = {"token": token, "pid": pid, "host": socket.gethostname(),
               "start": proc_start(pid), "heartbeat": time.time()}
        tmp = d / f"lease.{pid}.{threading.get_ident()}.tmp"
        private.write_file(tmp, json.dumps(doc).encode())
        os.replace(tmp, d / "lease")

    def read(self, run_id: str) -> dict[str, Any] | None:
        try:
            doc = json.loads((self.run_dir(run_id) / "lease").read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def remove(self, run_id: str, token: int) -> None:
        """Delete the lease if it is still ``token``'s."""
        doc = self.read(run_id)
        if doc and doc.get("token") == token:
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir(run_id) / "lease").unlink()

    def alive(self, run_id: str) -> bool:
        """True if the lease of ``run_id`` is held by a live process."""
        doc = self.read(run_id)
        if doc is None:
            return False
        try:
            if doc.get("host") == socket.gethostname():
                return pid_alive(int(doc["pid"]), doc.get("start"))
            return time.time() - float(doc.get("heartbeat", 0)) < REMOTE_TTL
        except (KeyError, TypeError, ValueError):
            return False

    # -- cancel requests -----------------------------------------------------------------
    def request_cancel(self, run_id: str) -> None:
        d = self.run_dir(run_id)
        private.make_dirs(d)
        private.write_file(d / "cancel", str(time.time()).encode())

    def cancel_requested(self, run_id: str) -> bool:
        return os.path.exists(self.folder / run_id / "cancel")

    def clear_cancel(self, run_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir(run_id) / "cancel").unlink()


class Heartbeat:
    """Renews a lease every second; notices when another driver took over."""

    def __init__(self, leases: Leases, run_id: str, token: int,
                 newest: Callable[[], int] | None = None) -> None:
        self.leases, self.run_id, self.token = leases, run_id, token
        self.newest = newest       # the highest token any driver of the run started
        self.fenced = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ledgerflow-lease-{run_id}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.beat()

    def beat(self) -> None:
        """Renew once now (or find out that the run was taken over)."""
        if self.fenced:
            return
        doc = self.leases.read(self.run_id)
        if (doc is not None and int(doc.get("token", 0)) > self.token) or (
                self.newest is not None and self.newest() > self.token):
            self.fenced = True   # taken over by a newer driver (maybe done already)
            self._stop.set()
            return
        # ours (or deleted by someone: it is still ours, write it again)
        with contextlib.suppress(OSError):
            self.leases.write(self.run_id, self.token)

    def stop(self) -> None:
        """Stop renewing; waits for a renewal in progress, so none is written after the
        caller removes the lease (a stale lease of a live process refuses every resume)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10.0)
