"""The runtime guard around a tool call: file, socket and program access it did not declare.

While a tool runs, an audit hook (:func:`sys.addaudithook`, installed once per
process on the first guarded call) checks what Python code does in that
thread's context:

* ``open`` and ``os.listdir`` / ``os.scandir``: reads must be inside the tool's
  read or write roots, writes (``w``, ``a``, ``x``, ``+`` or write flags)
  inside its write roots; so must ``os.remove``, ``os.rename``, ``os.mkdir``,
  ``os.rmdir``, ``os.chmod``, ``os.truncate``, ``os.link``, ``os.symlink``,
  ``os.utime``, ``shutil.rmtree`` and friends;
* ``socket.connect`` / ``sendto`` / ``bind`` / ``getaddrinfo``: only with
  ``network=True``;
* ``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.posix_spawn``,
  ``os.fork``: only with ``spawn=True``.

A refused operation raises :class:`~ledgerflow_agents.errors.PathNotAllowed`
(or :class:`~ledgerflow_agents.errors.ToolNotAllowed`) inside the tool, and is
remembered: even a tool that catches the error fails its task afterwards.
Reading Python code (``.py``, ``.pyc``, extension modules) and package
metadata (``*.dist-info``, ``*.egg-info``) anywhere, anything under the
interpreter's prefixes, listing the folders the import
system lists (``sys.path`` entries, packages), and reading what libraries
read about the machine (``/proc/stat``, ``/proc/cpuinfo``, cgroup limits, the
time zone; not ``/proc/self/environ``) is allowed, so imports work.

Limits, by construction of audit hooks: what C code does on its own (DuckDB
opening its file, a C library's sockets) is not seen, nor what threads the
tool starts do (they do not inherit the guard). This is a guard against a
model steering a tool somewhere it was not meant to go, not a sandbox: run
untrusted code as a ``ledgerflow.program`` task under bubblewrap.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.machinery
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import PathNotAllowed, ToolNotAllowed
from .tools import within

__all__ = ["Guard", "guarded"]

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_CODE = tuple(set(importlib.machinery.all_suffixes()) | {".pyc", ".pth", ".pyi"})
_PREFIXES = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix,
                                                          sys.exec_prefix)}))
#: audit events that change the file system: event -> indexes of its path arguments
_MUTATE = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,),
           "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.link": (0, 1),
           "os.symlink": (1,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
           "os.lchmod": (0,), "os.lchown": (0,), "shutil.rmtree": (0,),
           "shutil.copyfile": (1,), "shutil.copymode": (1,), "shutil.copystat": (1,),
           "shutil.copytree": (1,), "shutil.move": (0, 1), "os.mkfifo": (0,),
           "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
_LIST = ("os.listdir", "os.scandir")
_NET = ("socket.connect", "socket.sendto", "socket.sendmsg", "socket.bind",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr")
_SPAWN = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
          "os.fork", "os.forkpty", "pty.spawn", "os.startfile")


@dataclass(slots=True)
class Guard:
    """What one tool call may do, and what it tried that it may not."""

    tool: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    network: bool = False
    spawn: bool = False
    violations: list[tuple[str, str]] = field(default_factory=list)   # (kind, message)

    def refuse(self, kind: str, message: str) -> None:
        self.violations.append((kind, message))
        if kind == "path_not_allowed":
            raise PathNotAllowed(message)
        raise ToolNotAllowed(message)


_active: contextvars.ContextVar[Guard | None] = contextvars.ContextVar(
    "ledgerflow_tool_guard", default=None)
_busy = threading.local()
_installed = False
_install_lock = threading.Lock()


def _real(path: Any) -> str | None:
    if isinstance(path, int):
        return None                       # a file descriptor: opened before, already checked
    try:
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


#: What libraries read to learn about the machine (CPU count, memory, time zone); not
#: /proc/self/environ or other processes' files, which can hold secrets.
_SYSTEM = ("/proc/stat", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/stat",
           "/proc/self/status", "/proc/self/cgroup", "/proc/self/mountinfo",
           "/proc/self/maps", "/sys/devices/system/cpu", "/sys/fs/cgroup", "/etc/localtime",
           "/usr/share/zoneinfo", "/etc/ld.so.cache", "/dev/null", "/dev/urandom")
_SELF = re.compile(r"^/proc/(\d+)(?=/|$)")
#: installed packages' metadata (entry points, versions), which plugin lookups read
_METADATA = re.compile(r"/[^/]+\.(dist-info|egg-info)(/|$)")


def _is_code(path: str) -> bool:
    if path.endswith(_CODE) or within(path, _PREFIXES) or _METADATA.search(path):
        return True
    m = _SELF.match(path)
    if m and int(m.group(1)) == os.getpid():
        path = "/proc/self" + path[m.end():]
    return within(path, _SYSTEM)


def _is_code_dir(path: str) -> bool:
    """A folder the import system lists: on ``sys.path``, or a package."""
    if os.path.isfile(os.path.join(path, "__init__.py")):
        return True
    return any(path == os.path.realpath(p or ".") for p in sys.path if isinstance(p, str))


def _hook(event: str, args: tuple[Any, ...]) -> None:
    g = _active.get()
    if g is None or getattr(_busy, "on", False):
        return
    _busy.on = True
    try:
        _check(g, event, args)
    finally:
        _busy.on = False


def _check(g: Guard, event: str, args: tuple[Any, ...]) -> None:
    if event == "open":
        path = _real(args[0])
        if path is None:
            return
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        writes = bool(isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        _path(g, path, writes, "open")
    elif event in _LIST:
        path = _real(args[0] if args and args[0] is not None else ".")
        if path is not None and not _is_code_dir(path):
            _path(g, path, False, event)
    elif event in _MUTATE:
        if event == "os.mkdir" and len(args) > 2 and args[2] in (None, -1) \
                and os.path.lexists(args[0]):
            return              # fails with FileExistsError, changes nothing (makedirs probes)
        for i in _MUTATE[event]:
            if i < len(args):
                path = _real(args[i])
                if path is not None:
                    _path(g, path, True, event)
    elif event in _NET:
        if not g.network:
            g.refuse("tool_not_allowed", f"tool {g.tool!r} may not use the network "
                     f"({event}); declare @tool(network=True)")
    elif event.startswith(_SPAWN):
        if not g.spawn:
            g.refuse("tool_not_allowed", f"tool {g.tool!r} may not start programs "
                     f"({event}); declare @tool(spawn=True)")


def _path(g: Guard, path: str, writes: bool, event: str) -> None:
    if writes:
        if within(path, g.writes):
            return
        g.refuse("path_not_allowed", f"tool {g.tool!r} may not write {path} ({event}); "
                 f"its write roots: {', '.join(g.writes) or 'none'}")
    if within(path, g.reads + g.writes) or _is_code(path) or not os.path.exists(path):
        return                  # (a missing file reads nothing: libraries probe paths)
    g.refuse("path_not_allowed", f"tool {g.tool!r} may not read {path} ({event}); "
             f"its roots: {', '.join(g.reads + g.writes) or 'none'}")


def install() -> None:
    """Install the audit hook (once per process; it cannot be removed)."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True


@contextlib.contextmanager
def guarded(guard: Guard) -> Iterator[Guard]:
    """Run the ``with`` body (a tool call) under ``guard`` in this thread's context."""
    install()
    token = _active.set(guard)
    try:
        yield guard
    finally:
        _active.reset(token)
