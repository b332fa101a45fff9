"""Supervising one program attempt from the task's side: start, stream output, stop the tree.

:class:`Supervised` starts ``supervisor_main.py`` (``python -I -S``, its own
session) which forks the program; the task reads the program's stdout and
stderr line by line into :class:`Stream` (echo to the task's log, keep head
and tail) and the supervisor's status lines, and stops the whole tree on a
timeout, a cancel, or when the program leaves processes behind: SIGTERM to
the group and every descendant, SIGKILL after ``grace`` seconds, repeated
until none is left.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import tree
from .errors import ProgramError

__all__ = ["SUPERVISOR", "Ended", "Stream", "Supervised"]

#: The supervisor script, run by path (stdlib only; see its docstring).
SUPERVISOR = str(Path(__file__).with_name("supervisor_main.py"))
_POLL = 0.05                   # seconds between checks for cancel, timeout, a stopped tree
_KILL_AGAIN = 0.5              # while stopping, SIGKILL survivors again this often
_GIVE_UP = 30.0                # ... and give up this long after the first SIGKILL


class Stream:
    """One output stream: echo line by line, keep head and tail."""

    __slots__ = ("half", "head", "partial", "tail", "target", "total")

    def __init__(self, cap: int, target: Callable[[], Any]) -> None:
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.partial = b""
        self.total = 0
        self.target = target

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
        rest = data[max(room, 0):]
        if rest:
            self.tail += rest
            if len(self.tail) > 2 * self.half:
                del self.tail[:-self.half]
        buf = self.partial + data
        lines = buf.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > 65536:         # a very long line: pass it on in pieces
            lines.append(self.partial)
            self.partial = b""
        if lines:
            out = self.target()
            out.write("".join(line.decode("utf-8", "replace") + "\n" for line in lines))

    def close(self) -> None:
        if self.partial:
            self.target().write(self.partial.decode("utf-8", "replace") + "\n")
            self.partial = b""
        with_flush = getattr(self.target(), "flush", None)
        if with_flush is not None:
            try:
                with_flush()
            except (OSError, ValueError):
                pass

    def kept(self) -> tuple[str, int]:
        tail = bytes(self.tail[-self.half:]) if self.tail else b""
        dropped = self.total - len(self.head) - len(tail)
        text = self.head.decode("utf-8", "replace")
        if dropped:
            text += f"\n[... {dropped} bytes dropped ...]\n"
        return text + tail.decode("utf-8", "replace"), dropped

    def last_lines(self, n: int = 10, limit: int = 1500) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        data = bytes(self.tail) if dropped else bytes(self.head + self.tail)
        text = data.decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines() if ln.strip()][-n:]
        return "\n".join(lines)[-limit:]


@dataclass(slots=True)
class Ended:
    """How the supervised tree ended."""

    stopped: str | None            # "timeout", "cancel" or None
    status: int | None             # raw wait status of the program, None if unknown
    cpu_s: float
    exec_error: str
    note: str = ""                 # why the status is not the program's own (the sandbox's)


class Supervised:
    """One started program under its supervisor (driver side)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None,
                 rlimits: list[tuple[str, int, int]], keep_fds: tuple[int, ...] = ()) -> None:
        ctl_r, self.ctl_w = os.pipe()
        self.st_r, st_w = os.pipe()
        cfg = json.dumps({"argv": argv, "ctl": ctl_r, "status": st_w, "rlimits": rlimits})
        python = sys.executable or shutil.which("python3") or "python3"
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", SUPERVISOR, tree.SUPERVISOR_MARK, cfg], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                pass_fds=(ctl_r, st_w, *keep_fds), start_new_session=True)
        except BaseException:
            os.close(self.ctl_w)
            os.close(self.st_r)
            raise
        finally:
            os.close(ctl_r)
            os.close(st_w)
        tree.register(self.proc.pid)
        self.child = 0

    def members(self) -> list[int]:
        return tree.descendants(self.proc.pid)

    def signal_tree(self, sig: int) -> list[int]:
        """Send ``sig`` to the program's group and every descendant; return who was there."""
        pids = self.members()
        if self.child:
            try:
                os.killpg(self.child, sig)
            except OSError:
                pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return pids

    def follow(self, out: Stream, err: Stream, *, timeout: float | None, grace: float,
               cancelled: Callable[[], bool]) -> Ended:
        """Stream output until the program and every process it started are gone."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ, out)
        sel.register(self.proc.stderr.fileno(), selectors.EVENT_READ, err)
        sel.register(self.st_r, selectors.EVENT_READ, None)
        self.status: int | None = None
        self.cpu = 0.0
        self.exec_error = ""
        self.status_open = True
        self._status_buf = b""
        deadline = time.monotonic() + timeout if timeout is not None else None
        stopped: str | None = None
        stopping = False
        stop_at = next_kill = 0.0
        try:
            while True:
                self._read(sel, _POLL)
                now = time.monotonic()
                done = self.status is not None or bool(self.exec_error) or not self.status_open
                if not stopping:
                    if not done and deadline is not None and now >= deadline:
                        stopped = "timeout"
                    elif not done and cancelled():
                        stopped = "cancel"
                    if stopped is not None:
                        self.signal_tree(signal.SIGTERM)
                    elif not done:
                        continue
                    elif not self.signal_tree(signal.SIGTERM):   # it left nothing behind
                        break
                    stopping = True
                    stop_at, next_kill = now, now + grace
                    continue
                if done and not self.members():
                    break
                if now >= next_kill:
                    self.signal_tree(signal.SIGKILL)
                    next_kill = now + _KILL_AGAIN
                    if now - stop_at > grace + _GIVE_UP:
                        raise ProgramError(
                            f"could not stop processes {self.members()} of the program "
                            f"{_GIVE_UP:g}s after SIGKILL")
            # every writer of the output pipes is gone: read what is left in them
            end = time.monotonic() + 1.0
            while any(k.data is not None for k in sel.get_map().values()) \
                    and time.monotonic() < end:
                self._read(sel, 0.05)
        finally:
            sel.close()
        out.close()
        err.close()
        return Ended(stopped, self.status, self.cpu, self.exec_error)

    def _read(self, sel: selectors.BaseSelector, wait: float) -> None:
        for key, _ in sel.select(wait):
            try:
                data = os.read(key.fd, 65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fd)
                if key.fd == self.st_r:
                    self.status_open = False
            elif key.data is not None:
                key.data.feed(data)
            else:
                self._status(data)

    def _status(self, data: bytes) -> None:
        self._status_buf += data
        while b"\n" in self._status_buf:
            line, self._status_buf = self._status_buf.split(b"\n", 1)
            kind, _, rest = line.decode().partition(" ")
            if kind == "P":
                self.child = int(rest)
            elif kind == "X":
                raw, used, _rss = rest.split()
                self.status, self.cpu = int(raw), float(used)
            elif kind == "E":
                self.exec_error = json.loads(rest)

    def close(self) -> None:
        """Make sure nothing is left (also after an error), then release the supervisor."""
        try:
            if self.members():
                self.signal_tree(signal.SIGKILL)
        finally:
            os.close(self.ctl_w)           # EOF: the supervisor kills what is left and exits
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.signal_tree(signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
            for f in (self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()
            os.close(self.st_r)
            tree.forget(self.proc.pid)
