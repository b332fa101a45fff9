"""A throwaway PostgreSQL server for tests and benchmarks: initdb, pg_ctl start/stop.

``initdb`` refuses to run as root, so as root the data directory is made by
(and the server runs as) the ``postgres`` user through ``runuser``. The
server listens on 127.0.0.1 and a free port, its socket in its own
directory, with ``trust`` authentication for local connections.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_bin(name: str) -> str | None:
    """The PostgreSQL server program ``name`` (PATH, then Debian's versioned folders)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return None


def missing_reason() -> str | None:
    """Why no server can be started here (None: one can)."""
    if find_bin("initdb") is None or find_bin("pg_ctl") is None:
        return ("PostgreSQL server binaries (initdb, pg_ctl) not found: "
                "apt-get install postgresql (./dev setup does it)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: cannot start initdb as another user"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed: pip install 'ledgerflow[postgres]'"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster in a temp directory (see the module docstring)."""

    def __init__(self, base: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lf-pg-", dir=base))
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.port = free_port()
        self.log = self.root / "server.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres", "postgres")
        self.sock.mkdir()
        if self._as_user:
            shutil.chown(self.sock, "postgres", "postgres")
        self._run(find_bin("initdb") or "initdb", "-D", str(self.data), "-U", "postgres",
                  "-A", "trust", "-E", "UTF8", "--no-sync")
        conf = self.data / "postgresql.conf"
        with conf.open("a") as fh:
            # a small server for tests: few connections, no fsync wait on shutdown checkpoints
            fh.write("\nmax_connections = 60\nshared_buffers = 32MB\n"
                     "fsync = on\nlisten_addresses = '127.0.0.1'\n"
                     f"port = {self.port}\nunix_socket_directories = '{self.sock}'\n")

    @property
    def url(self) -> str:
        """A libpq URL of the ``postgres`` database as the ``postgres`` user."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as_user, *argv], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, cwd=self.root)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run(find_bin("pg_ctl") or "pg_ctl", "-D", str(self.data), "-l", str(self.log),
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: like a crash; recovery runs at the next start)."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(find_bin("pg_ctl") or "pg_ctl", "-D", str(self.data), "-m", mode,
                      "-w", "-t", "60", "stop")

    def create_schema(self, name: str) -> str:
        """Create schema ``name`` in the ``postgres`` database; return a URL whose
        ``search_path`` is that schema (cheaper than a database per test)."""
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.url}?options=-csearch_path%3D{name}"

    def create_database(self, name: str) -> str:
        """Create database ``name``; return its URL."""
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def started_or_skip() -> PgServer:
    """A started server; the calling test skips saying why when no server binary can be
    had (and fails in CI, which must run the PostgreSQL tests)."""
    import pytest

    reason = missing_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the postgres tests: {reason}")
        pytest.skip(reason)
    server = PgServer()
    server.start()
    return server

