"""Program tasks: run a command as a task, and stop its whole process tree.

``program(name, argv=[...])`` returns a :class:`ProgramTask`, used in a
pipeline like any task (``.map``, retries, caching). How an attempt runs:

* **No shell.** argv is executed directly. Keyword arguments of the call
  reach the program as ``{name}`` placeholders, each replaced inside its one
  argv element (never re-split), and as ``LEDGERFLOW_PARAM_<NAME>``
  environment variables. ``shell=True`` runs one command string with
  ``/bin/sh -c`` and fills no placeholders (use ``"$LEDGERFLOW_PARAM_X"``).
* **A supervisor per attempt.** The program is started by a small Python
  process (``python -I -S -c``, stdlib only) that makes itself the *child
  subreaper* (descendants that call ``setsid`` and lose their parent are
  re-parented to it, not to init, so they stay findable), applies the
  rlimits in the forked child before ``exec`` (``preexec_fn`` is not
  thread-safe; ``prlimit`` would be one more tool and could not subreap),
  puts the program in its own process group, reaps, reports the exit status
  and CPU time, and, when the process running the task dies (its lifeline
  pipe reaches EOF), SIGKILLs the whole tree. The supervisor runs in its own
  session, so a Ctrl-C at the terminal reaches the driver only.
* **Stopping** (timeout, cancel, or processes left behind after the program
  exits): SIGTERM to the group and to every descendant of the supervisor,
  then SIGKILL after ``grace`` seconds, repeated until none is left. The
  attempt ends only then: ``TaskTimedOut`` (outcome ``timeout``) or
  ``TaskCancelled`` (outcome ``cancelled``).
* **Output** is read line by line and written to the task's ``sys.stdout``
  / ``sys.stderr`` (the per-attempt log); the result keeps the head and the
  tail of each stream with the number of bytes dropped between them.

Linux only (``/proc``, ``prctl``). See the README section "Program tasks".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from .context import TaskCancelled, TaskTimedOut, context, current_build
from .errors import DefinitionError, NonRetryableError
from .keys import digest
from .task import Task, TaskOptions

__all__ = [
    "LimitExceeded",
    "Limits",
    "ProgramError",
    "ProgramResult",
    "ProgramTask",
    "SandboxUnavailable",
    "descendants",
    "is_supervisor",
    "program",
]

#: Marker at the start of the supervisor's code: find supervisors by their argv.
SUPERVISOR_MARK = "# ledgerflow-program-supervisor"
_POLL = 0.05                   # seconds between checks for cancel, timeout, a stopped tree
_KILL_AGAIN = 0.5              # while stopping, SIGKILL survivors again this often
_GIVE_UP = 30.0                # ... and give up this long after the first SIGKILL


# -- public types ----------------------------------------------------------------------

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


class ProgramResult(TypedDict):
    """What a program task returns (JSON; stored as the task's result)."""

    argv: list[str]
    exit_code: int | None          # None when a signal ended it
    signal: str | None             # e.g. "SIGKILL"
    stdout: str                    # head and tail; a marker line says what was dropped
    stderr: str
    stdout_bytes: int              # total bytes the program wrote
    stderr_bytes: int
    stdout_dropped: int            # bytes left out between head and tail
    stderr_dropped: int
    outputs: dict[str, str]        # declared output path -> content hash


class ProgramError(Exception):
    """The program failed: an exit code not in ``ok_codes``, a signal, a missing output.

    Retried by the task's policy (``retries``, ``retry_on``).
    """

    def __init__(self, message: str, exit_code: int | None = None,
                 signal_name: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.signal = signal_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.exit_code, self.signal))


class LimitExceeded(ProgramError):
    """The program hit one of its :class:`Limits`; ``limit`` names it (e.g. ``memory_mb``)."""

    def __init__(self, message: str, exit_code: int | None = None,
                 signal_name: str | None = None, limit: str = "") -> None:
        super().__init__(message, exit_code, signal_name)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.exit_code, self.signal, self.limit))


class SandboxUnavailable(NonRetryableError):
    """``sandbox="bwrap"`` was asked for and bubblewrap is not installed."""


# -- the process tree ------------------------------------------------------------------

def _proc_table() -> tuple[dict[int, list[int]], set[int]]:
    """``(children by parent pid, live pids)`` from /proc (zombies are not live)."""
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return children, live
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) < 2:
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        if fields[0] not in (b"Z", b"X"):
            live.add(pid)
    return children, live


def descendants(root: int, *, prune: Iterable[int] = ()) -> list[int]:
    """Live descendants of ``root`` (not ``root`` itself), parents before children.

    Processes in ``prune`` and everything below them are left out.
    """
    children, live = _proc_table()
    skip = set(prune)
    out: list[int] = []
    todo = deque(children.get(root, ()))
    seen = {root}
    while todo:
        pid = todo.popleft()
        if pid in seen or pid in skip:
            continue
        seen.add(pid)
        if pid in live:
            out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def is_supervisor(pid: int) -> bool:
    """True if ``pid`` is a program supervisor (found by the marker in its argv)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return SUPERVISOR_MARK.encode() in fh.read()
    except OSError:
        return False


_SUPERVISORS: dict[int, None] = {}
_SUPERVISORS_LOCK = threading.Lock()


def supervisor_pids() -> list[int]:
    """Pids of the program supervisors this process has running."""
    with _SUPERVISORS_LOCK:
        return list(_SUPERVISORS)


#: The supervisor (see the module docstring). Run as ``python -I -S -c`` with one
#: JSON argument; stdlib only; nothing of ledgerflow is imported.
_SUPERVISOR = SUPERVISOR_MARK + r'''
import json, os, select, signal, sys
cfg = json.loads(sys.argv[1])
ctl, st = cfg["ctl"], cfg["status"]
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *a: None)
signal.set_wakeup_fd(wake_w)
err_r, err_w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE,
                  signal.SIGCHLD, signal.SIGXFSZ, signal.SIGXCPU):
            signal.signal(s, signal.SIG_DFL)
        if cfg["rlimits"]:
            import resource
            for name, soft, hard in cfg["rlimits"]:
                which = getattr(resource, name)
                cur = resource.getrlimit(which)[1]
                if cur != resource.RLIM_INFINITY:
                    hard = min(hard, cur)
                resource.setrlimit(which, (min(soft, hard), hard))
        for fd in (ctl, st, wake_r, wake_w, err_r):
            os.close(fd)
        os.execvp(cfg["argv"][0], cfg["argv"])
    except BaseException as e:
        try:
            os.write(err_w, ("%s: %s" % (type(e).__name__, e)).encode()[:4000])
        finally:
            os._exit(127)
try:
    os.setpgid(pid, pid)
except OSError:
    pass
os.close(err_w)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 1)      # the program holds the output pipes, not the supervisor: the
os.dup2(null, 2)      # driver sees EOF once every process of the tree has gone
msg = b""
while True:
    chunk = os.read(err_r, 4096)
    if not chunk:
        break
    msg += chunk
os.close(err_r)
def say(text):
    try:
        os.write(st, (text + "\n").encode())
    except OSError:      # the driver is gone: keep going, the tree must still be killed
        pass
if msg:
    say("E " + json.dumps(msg.decode("utf-8", "replace")))
else:
    say("P %d" % pid)
def tree():
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            kids.setdefault(int(data[data.rfind(b")") + 2:].split()[1]), []).append(int(name))
    out, todo = [], list(kids.get(os.getpid(), ()))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out
def reap():
    global main_done
    while True:
        try:
            p, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if p == 0:
            return True
        if p == pid and not main_done:
            main_done = True
            say("X %d %.6f %d" % (status, ru.ru_utime + ru.ru_stime, ru.ru_maxrss))
main_done = False
while True:
    reap()
    try:
        ready = select.select([ctl, wake_r], [], [], 1.0)[0]
    except InterruptedError:
        continue
    if wake_r in ready:
        try:
            os.read(wake_r, 4096)
        except BlockingIOError:
            pass
    if ctl in ready and not os.read(ctl, 64):
        break     # the task is done with us, or the process running it died
while True:       # kill whatever is left below us, reap it, then go
    for p in tree():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    if not reap():
        break
    select.select([wake_r], [], [], 0.05)
'''


# -- running one attempt ---------------------------------------------------------------

class _Stream:
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
class _Ended:
    """How the supervised tree ended."""

    stopped: str | None            # "timeout", "cancel" or None
    status: int | None             # raw wait status of the program, None if unknown
    cpu_s: float
    exec_error: str


class _Supervised:
    """One started program under its supervisor (driver side)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None,
                 rlimits: list[tuple[str, int, int]]) -> None:
        ctl_r, self.ctl_w = os.pipe()
        self.st_r, st_w = os.pipe()
        cfg = json.dumps({"argv": argv, "ctl": ctl_r, "status": st_w, "rlimits": rlimits})
        python = sys.executable or shutil.which("python3") or "python3"
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _SUPERVISOR, cfg], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                pass_fds=(ctl_r, st_w), start_new_session=True)
        except BaseException:
            os.close(self.ctl_w)
            os.close(self.st_r)
            raise
        finally:
            os.close(ctl_r)
            os.close(st_w)
        with _SUPERVISORS_LOCK:
            _SUPERVISORS[self.proc.pid] = None
        self.child = 0

    def members(self) -> list[int]:
        return descendants(self.proc.pid)

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

    def follow(self, out: _Stream, err: _Stream, *, timeout: float | None, grace: float,
               cancelled: Callable[[], bool]) -> _Ended:
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
        return _Ended(stopped, self.status, self.cpu, self.exec_error)

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
            with _SUPERVISORS_LOCK:
                _SUPERVISORS.pop(self.proc.pid, None)


# -- placeholders, environment, fingerprints --------------------------------------------

_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _names(template: str) -> set[str]:
    return {m.group(1) for m in _FIELD.finditer(template) if m.group(1)}


def _fill(template: str, values: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return values[m.group(1)]
    return _FIELD.sub(sub, template)


def _text(value: object) -> str:
    """A parameter as the program sees it (argv element or environment value)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, default=str)


def _hash_path(path: str) -> str | None:
    """Content hash of a file (or of a directory's files and names); None if missing."""
    h = hashlib.blake2b(digest_size=16)
    if os.path.isdir(path):
        for base, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(base, name)
                h.update(os.path.relpath(full, path).encode() + b"\x00")
                h.update((_hash_path(full) or "missing").encode())
        return h.hexdigest()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def carrier_env(carrier: Mapping[str, str]) -> dict[str, str]:
    """A propagation carrier as environment variables: ``traceparent`` -> ``TRACEPARENT``.

    The OpenTelemetry convention for passing context to a child process
    (``TRACEPARENT``, ``TRACESTATE``, ``BAGGAGE``).

    Example:
        >>> carrier_env({"traceparent": "00-ab-cd-01"})
        {'TRACEPARENT': '00-ab-cd-01'}
    """
    return {re.sub(r"[^A-Z0-9_]", "_", k.upper()): v for k, v in carrier.items()}


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


_MEMORY = re.compile(r"MemoryError|Cannot allocate memory|out of memory|bad_alloc|ENOMEM",
                     re.IGNORECASE)
_NOFILE = re.compile(r"Too many open files|EMFILE")
_NPROC = re.compile(r"Resource temporarily unavailable|EAGAIN|fork", re.IGNORECASE)
_FSIZE = re.compile(r"File too large|EFBIG")


def _limit_hit(limits: Limits | None, sig: int | None, cpu: float, stderr: str) -> str | None:
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


# -- the task --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Program:
    """What a program task runs: the callable behind a :class:`ProgramTask`.

    Small, immutable and picklable by reference to this module, so it travels
    to process and Dask workers as it is.
    """

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    inherit_env: bool
    cwd: str | None
    timeout: float | None
    grace: float
    ok_codes: tuple[int, ...]
    limits: Limits | None
    sandbox: str | None
    network: bool
    read_only: tuple[str, ...]
    writable: tuple[str, ...]
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    shell: bool
    output_cap: int

    @property
    def stop_grace(self) -> float:
        """Seconds this task may need to stop after a cancel request (TERM, grace, KILL)."""
        return 2 * self.grace + 2.0

    def placeholders(self) -> set[str]:
        """Every ``{name}`` the templates use."""
        found: set[str] = set()
        templates = [*self.inputs, *self.outputs, *(v for _, v in self.env)]
        if not self.shell:
            templates += self.argv
        if self.cwd:
            templates.append(self.cwd)
        for t in templates:
            found |= _names(t)
        return found

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's parameters by name (a ``.map`` item arrives as ``item``)."""
        if len(args) > 1:
            raise TypeError(f"program task {self.name!r} takes keyword arguments "
                            f"(and one positional item from .map), given {len(args)} "
                            "positional arguments")
        params = dict(kwargs)
        if args:
            if "item" in params:
                raise TypeError(f"program task {self.name!r} got 'item' twice")
            params["item"] = args[0]
        return params

    def _paths(self, templates: Sequence[str], text: Mapping[str, str],
               cwd: str | None) -> list[str]:
        base = cwd or os.getcwd()
        return [os.path.normpath(os.path.join(base, _fill(t, text))) for t in templates]

    def input_hashes(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                     ) -> list[tuple[str, str | None]]:
        """``(path, content hash or None)`` of each declared input for this call."""
        if not self.inputs:
            return []
        text = {k: _text(v) for k, v in self.bind(args, kwargs).items()}
        cwd = os.path.abspath(_fill(self.cwd, text)) if self.cwd else None
        return [(p, _hash_path(p)) for p in self._paths(self.inputs, text, cwd)]

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramResult:
        params = self.bind(args, kwargs)
        missing = self.placeholders() - set(params)
        if missing:
            raise TypeError(f"program task {self.name!r} needs the parameters "
                            f"{sorted(missing)} used in its placeholders")
        ctx = context()
        text = {k: _text(v) for k, v in params.items()}
        cwd = os.path.abspath(_fill(self.cwd, text)) if self.cwd else None
        if self.shell:
            argv = ["/bin/sh", "-c", self.argv[0]]
        else:
            argv = [_fill(a, text) for a in self.argv]
        env = dict(os.environ) if self.inherit_env else {
            "PATH": os.environ.get("PATH", os.defpath)}
        if ctx.carrier:     # trace context of the attempt (TRACEPARENT...), unless env= sets it
            env.update(carrier_env(ctx.carrier))
        env.update({k: _fill(v, text) for k, v in self.env})
        env.update({f"LEDGERFLOW_PARAM_{k.upper()}": v for k, v in text.items()})
        env.update(LEDGERFLOW_RUN_ID=ctx.run_id, LEDGERFLOW_TASK_KEY=ctx.task_key,
                   LEDGERFLOW_ATTEMPT=str(ctx.attempt))
        for path, chash in self.input_hashes(args, kwargs):
            ctx.record_input(path, chash)
        outputs = self._paths(self.outputs, text, cwd)
        command = argv
        if self.sandbox == "bwrap":
            command = self._bwrap(cwd, text, outputs) + argv
        for path in outputs:            # a stale file from an earlier attempt is no output
            if os.path.isfile(path):
                os.unlink(path)
        try:
            tree = _Supervised(command, env, cwd, self.limits.rlimits() if self.limits else [])
        except OSError as exc:
            raise ProgramError(f"program {self.name!r} could not start: {exc}") from None
        out = _Stream(self.output_cap, lambda: sys.stdout)
        err = _Stream(self.output_cap, lambda: sys.stderr)
        try:
            ended = tree.follow(out, err, timeout=self.timeout, grace=self.grace,
                                cancelled=lambda: ctx.cancel_requested)
        finally:
            tree.close()
        return self._result(ended, argv, out, err, outputs)

    def _result(self, ended: _Ended, argv: list[str], out: _Stream, err: _Stream,
                outputs: list[str]) -> ProgramResult:
        ctx = context()
        how = f"TERM, then KILL after {self.grace:g}s"
        if ended.stopped == "timeout":
            raise TaskTimedOut(f"program {self.name!r} ran past its {self.timeout:g}s timeout; "
                               f"its process tree was stopped ({how})")
        if ended.stopped == "cancel":
            raise TaskCancelled(f"program {self.name!r} cancelled; its process tree was "
                                f"stopped ({how})")
        if ended.exec_error:
            raise ProgramError(f"program {self.name!r} could not start {argv[0]!r}: "
                               f"{ended.exec_error}", 127)
        if ended.status is None:
            raise ProgramError(f"program {self.name!r}: its supervisor died; exit unknown")
        code = os.waitstatus_to_exitcode(ended.status)
        sig = -code if code < 0 else None
        exit_code = None if sig is not None else code
        tail = err.last_lines()
        if sig is not None or code not in self.ok_codes:
            what = f"was killed by {_signame(sig)}" if sig is not None \
                else f"exited with code {code} (ok: {', '.join(map(str, self.ok_codes))})"
            limit = _limit_hit(self.limits, sig, ended.cpu_s, tail)
            stderr = f"; last lines of stderr:\n{tail}" if tail else "; stderr was empty"
            if limit is not None:
                value = getattr(self.limits, limit)
                raise LimitExceeded(f"program {self.name!r} hit its {limit} limit "
                                    f"({limit}={value:g}): it {what}{stderr}", exit_code,
                                    _signame(sig) if sig else None, limit)
            raise ProgramError(f"program {self.name!r} {what}{stderr}", exit_code,
                               _signame(sig) if sig else None)
        hashes: dict[str, str] = {}
        for path in outputs:
            chash = _hash_path(path)
            if chash is None:
                raise ProgramError(f"program {self.name!r} exited {code} but did not write "
                                   f"its declared output {path}", exit_code)
            hashes[path] = chash
            ctx.record_output(path, chash)
        stdout, out_dropped = out.kept()
        stderr_text, err_dropped = err.kept()
        return ProgramResult(argv=argv, exit_code=exit_code, signal=None, stdout=stdout,
                             stderr=stderr_text, stdout_bytes=out.total,
                             stderr_bytes=err.total, stdout_dropped=out_dropped,
                             stderr_dropped=err_dropped, outputs=hashes)

    def _bwrap(self, cwd: str | None, text: Mapping[str, str],
               outputs: list[str]) -> list[str]:
        exe = shutil.which("bwrap")
        if exe is None:
            raise SandboxUnavailable(
                f"program {self.name!r} asks for sandbox='bwrap' but bubblewrap is not "
                "installed (apt-get install bubblewrap)")
        here = cwd or os.getcwd()
        writable = self._paths(self.writable, text, cwd)
        writable += [os.path.dirname(p) for p in outputs]
        for path in writable:
            os.makedirs(path, exist_ok=True)
        read_only = self._paths(self.read_only, text, cwd)
        visible = [here, *self._paths(self.inputs, text, cwd)]
        args = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", "--unshare-pid", "--die-with-parent", "--new-session"]
        if not self.network:
            args.append("--unshare-net")
        # later mounts cover earlier ones: first what must be seen (under the private
        # /tmp), then writable and read-only paths, parents before children, so the more
        # specific one wins (read-only wins for the same path)
        for path in sorted(set(visible), key=len):
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        binds = [(p, 0, "--bind") for p in set(writable)] + \
                [(p, 1, "--ro-bind") for p in set(read_only)]
        for path, _, opt in sorted(binds, key=lambda b: (b[0].rstrip("/").count("/"), b[1])):
            if os.path.exists(path):
                args += [opt, path, path]
        return [*args, "--chdir", here, "--"]


class ProgramTask(Task[..., ProgramResult]):
    """A task that runs a program (made by :func:`program`)."""

    def __init__(self, spec: _Program, options: TaskOptions) -> None:
        super().__init__(spec, options)
        self.spec = spec

    @property
    def stop_grace(self) -> float:
        """Seconds it may need to stop its tree after a cancel request (executors read it)."""
        return self.spec.stop_grace

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramResult:
        if current_build.get() is not None:        # tracing: check the call now
            params = self.spec.bind(args, {k: v for k, v in kwargs.items() if k != "after"})
            missing = self.spec.placeholders() - set(params)
            if missing:
                raise DefinitionError(
                    f"program task {self.name!r} is called without {sorted(missing)}, "
                    "used in its placeholders",
                    hint="pass them as keyword arguments, e.g. "
                    f"{self.name}({sorted(missing)[0]}=...)")
        return super().__call__(*args, **kwargs)

    def _extra_fingerprint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The content hashes of the declared input files of this call."""
        try:
            pairs = self.spec.input_hashes(args, kwargs)
        except Exception as exc:   # e.g. a placeholder without a parameter: fails at run time
            return f"unhashable inputs: {exc}".encode()
        return b"\x00".join(f"{p}={h or 'missing'}".encode() for p, h in pairs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProgramTask, (self.fn, self.options))

    def __repr__(self) -> str:
        return f"<program {self.name}>"


def program(name: str, argv: Sequence[str] | str, *, env: Mapping[str, str] | None = None,
            inherit_env: bool = True, cwd: str | os.PathLike[str] | None = None,
            timeout: float | None = None, grace: float = 5.0,
            ok_codes: Iterable[int] = (0,), limits: Limits | None = None,
            sandbox: Literal["bwrap"] | None = None, network: bool = True,
            read_only: Sequence[str] = (), writable: Sequence[str] = (),
            outputs: Sequence[str] = (), inputs: Sequence[str] = (), shell: bool = False,
            output_cap: int = 64 * 1024, retries: int = 0, retry_delay: float = 0.0,
            backoff: float = 1.0, jitter: float = 0.0,
            retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
            cache: bool = True, version: str | None = None) -> ProgramTask:
    """Make a task that runs a program.

    Args:
        name: the task name.
        argv: the command, one element per argument; ``{param}`` placeholders are
            filled from the call's keyword arguments inside their element. With
            ``shell=True``, one command string for ``/bin/sh -c`` (no placeholders).
        env: extra environment variables (values may hold placeholders); the
            call's parameters are also set as ``LEDGERFLOW_PARAM_<NAME>``.
        inherit_env: start from the task process's environment (else only PATH).
        cwd: working directory (may hold placeholders); default: the task's.
        timeout: seconds the program may run; then its tree is stopped and the
            attempt ends ``timeout`` (retried by policy).
        grace: seconds between SIGTERM and SIGKILL when stopping the tree.
        ok_codes: exit codes that count as success.
        limits: rlimits for the program (:class:`Limits`).
        sandbox: ``"bwrap"`` runs it under bubblewrap: read-only root, private
            /tmp, own pid namespace; only ``writable`` paths (and the folders of
            ``outputs``) can be written.
        network: with the sandbox, ``False`` leaves only a loopback of its own.
        read_only: with the sandbox, paths kept read-only (also inside writable ones).
        writable: with the sandbox, paths the program may write (made if missing).
        outputs: files the program writes; checked, hashed and recorded as lineage.
        inputs: files or folders it reads; hashed into the fingerprint and lineage.
        shell: run ``argv`` (a string) with ``/bin/sh -c``.
        output_cap: bytes of each stream kept in the result (half head, half tail).
        retries, retry_delay, backoff, jitter, retry_on, cache: as for ``@task``.
        version: added to the fingerprint (argv, env and the other settings
            that change what runs are always in it).

    Example:
        >>> from ledgerflow.program import program
        >>> hello = program("hello", ["echo", "hello {who}"])
        >>> hello(who="world")["stdout"]
        'hello world\\n'
    """
    if shell:
        if not isinstance(argv, str):
            raise DefinitionError(f"program {name!r}: shell=True needs one command string",
                                  hint='pass argv="cmd \\"$LEDGERFLOW_PARAM_X\\""')
        argv_t: tuple[str, ...] = (argv,)
    else:
        if isinstance(argv, str):
            raise DefinitionError(
                f"program {name!r}: argv is a string; without a shell it must be a list",
                hint=f"pass argv={argv.split()!r}, or shell=True if you need a shell")
        argv_t = tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv)
        if not argv_t or not all(isinstance(a, str) for a in argv_t):
            raise DefinitionError(f"program {name!r}: argv must be a non-empty list of strings",
                                  hint='e.g. argv=["pdftotext", "{src}", "-"]')
    if timeout is not None and timeout <= 0:
        raise DefinitionError(f"program {name!r}: timeout must be positive, given {timeout}",
                              hint="pass timeout=None for no limit")
    if output_cap < 2:
        raise DefinitionError(f"program {name!r}: output_cap must be at least 2 bytes",
                              hint="output_cap=65536 keeps 32 KiB of head and of tail")
    if grace < 0:
        raise DefinitionError(f"program {name!r}: grace must be 0 or more, given {grace}",
                              hint="grace=5 waits 5 s between SIGTERM and SIGKILL")
    if sandbox not in (None, "bwrap"):
        raise DefinitionError(f"program {name!r}: unknown sandbox {sandbox!r}",
                              hint='use sandbox="bwrap" or leave it out')
    if sandbox is None and (not network or read_only or writable):
        raise DefinitionError(
            f"program {name!r}: network=False, read_only and writable need a sandbox",
            hint='add sandbox="bwrap" (Debian package bubblewrap)')
    spec = _Program(
        name=name, argv=argv_t, env=tuple(sorted((env or {}).items())),
        inherit_env=inherit_env, cwd=os.fspath(cwd) if cwd is not None else None,
        timeout=timeout, grace=float(grace), ok_codes=tuple(ok_codes), limits=limits,
        sandbox=sandbox, network=network, read_only=tuple(read_only),
        writable=tuple(writable), outputs=tuple(outputs), inputs=tuple(inputs), shell=shell,
        output_cap=output_cap)
    what = json.dumps({"argv": spec.argv, "env": spec.env, "inherit_env": inherit_env,
                       "cwd": spec.cwd, "ok_codes": spec.ok_codes, "shell": shell,
                       "limits": limits.rlimits() if limits else None, "sandbox": sandbox,
                       "network": network, "read_only": spec.read_only,
                       "writable": spec.writable, "outputs": spec.outputs,
                       "inputs": spec.inputs, "version": version}, sort_keys=True)
    if retry_on is None:
        kinds: tuple[type[BaseException], ...] = (Exception,)
    elif isinstance(retry_on, type):
        kinds = (retry_on,)
    else:
        kinds = tuple(retry_on)
    if retries < 0:
        raise DefinitionError(f"retries must be 0 or more, given: {retries}",
                              hint="use retries=0 for a single attempt")
    # no runner-level timeout: the task enforces its own and ends only once the tree is gone
    options = TaskOptions(retries=retries, retry_delay=retry_delay, backoff=backoff,
                          jitter=jitter, timeout=None, retry_on=kinds, cache=cache,
                          version="program:" + digest(what.encode()), name=name)
    return ProgramTask(spec, options)


class _ProgramModule(types.ModuleType):
    """Lets ``ledgerflow.program(...)`` call :func:`program` even once this module,
    of the same name, has been imported (the import binds the module there)."""

    def __call__(self, name: str, argv: Sequence[str] | str, **options: Any) -> ProgramTask:
        return program(name, argv, **options)


sys.modules[__name__].__class__ = _ProgramModule
