"""The runtime guard around a tool call: file, socket and program access it did not declare.

While a tool runs, an audit hook (:func:`sys.addaudithook`, installed once per
process on the first guarded call) checks what Python code does in that
thread's context:

* ``open`` and ``os.listdir`` / ``os.scandir``: reads must be inside the tool's
  read or write roots, writes (``w``, ``a``, ``x``, ``+`` or write flags)
  inside its write roots; so must ``os.remove``, ``os.rename``, ``os.mkdir``,
  ``os.rmdir``, ``os.chmod``, ``os.truncate``, ``os.link``, ``os.symlink``,
  ``os.utime``, ``shutil.rmtree`` and friends;
* ``sqlite3.connect``: the database file counts as a write (SQLite opens it
  read-write and may create it);
* ``socket.connect`` / ``sendto`` / ``bind`` / ``getaddrinfo``: only with
  ``network=True``;
* ``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.posix_spawn``,
  ``os.fork``: only with ``spawn=True``.

A refused operation raises :class:`~ledgerflow_agents.errors.PathNotAllowed`
(or :class:`~ledgerflow_agents.errors.ToolNotAllowed`) inside the tool, and is
remembered: even a tool that catches the error fails its task afterwards.

**Who asks.** The runtime reads files the tool never named: the import system
reads code, a plugin lookup reads package metadata, an embedding library reads
``/proc/sys/kernel/random/boot_id`` and ``/proc/self/mounts`` and its model
cache. The guard tells these apart from the tool's own reads by the Python
frame that asks for the file, skipping the standard-library modules that only
open on a caller's behalf (``pathlib``, ``io``, ``shutil``, ``tempfile``...):

* **the tool's own code** (the tool function's file; with no tool file known,
  any code outside the interpreter's prefixes) may read only its roots, plus
  harmless facts about the machine (``/proc/stat``, ``/proc/cpuinfo``, its own
  ``/proc/self/status``, cgroup limits, the time zone, ``/dev/null``). A path
  the model chose cannot reach a ``.py``, ``.pth`` or ``*.dist-info`` file
  outside the roots, neither directly nor through a module that reads what its
  caller names (``linecache``, ``tokenize`` pass the question on; ``configparser``
  or a data library asks for itself and is no code reader);
* **the runtime** (the import system, the standard library, installed
  packages, other modules) may also read code and package metadata inside the
  import roots (``sys.path`` entries) and the interpreter's prefixes, when it
  is the import system or a module that reads code for it (``importlib``,
  ``inspect``, ``traceback``, ``warnings``...), a module being imported, or a
  library reading its own package's files; any of them may read the
  process's identity files (``/proc/sys/kernel/random/boot_id``, its own
  ``/proc/PID/mounts``...), and the model caches (``HF_HOME``,
  ``TORCH_HOME``, ``SENTENCE_TRANSFORMERS_HOME``, ``~/.cache/huggingface``,
  ``~/.cache/torch``, ``~/.cache/ledgerflow``; never a ``token`` file there),
  and list the folders the import system lists. It may also make and remove
  new files and folders in the temporary folder (``tempfile``'s probe, a
  library's scratch file: created ``O_EXCL``, never an existing file) and
  write in the model caches.

Nobody may read ``/proc/self/environ`` (secrets) or another process's files.

**Threads.** A thread the tool starts (``threading.Thread``, or
``_thread.start_new_thread``) runs under the tool's guard for its whole life,
and work the tool submits to a ``ThreadPoolExecutor`` runs under it (a pool's
worker thread itself does not: it serves later callers too). What they are
refused fails the tool call like the tool's own refusal, when it happens
before the tool returns; later, it is refused in the thread all the same.

Limits, by construction of audit hooks: what C code does on its own (DuckDB
opening its file, a C library's sockets and threads) is not seen. This is a
guard against a model steering a tool somewhere it was not meant to go, not a
sandbox: run untrusted code as a ``ledgerflow.program`` task under bubblewrap.
"""

from __future__ import annotations

import _thread
import concurrent.futures
import concurrent.futures.thread
import contextlib
import contextvars
import importlib.machinery
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
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
    #: the real paths of the tool's own source files (empty: any code outside the
    #: interpreter's prefixes counts as the tool's)
    code: frozenset[str] = frozenset()

    @staticmethod
    def code_of(fn: Any) -> frozenset[str]:
        """The source files of ``fn`` and of what it wraps (``functools.wraps``)."""
        out = set()
        while fn is not None:
            code = getattr(fn, "__code__", None)
            if code is not None:
                out.add(os.path.realpath(code.co_filename))
            fn = getattr(fn, "__wrapped__", None)
        return frozenset(out)

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


#: Harmless facts about the machine any caller may read (CPU count, memory, time zone);
#: not /proc/self/environ or other processes' files, which can hold secrets.
_SYSTEM = ("/proc/stat", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/stat",
           "/proc/self/status", "/proc/self/cgroup", "/sys/devices/system/cpu",
           "/sys/fs/cgroup", "/etc/localtime", "/usr/share/zoneinfo", "/dev/null",
           "/dev/urandom")
#: What the runtime reads about the process and the host (identity, mounts, loader).
_IDENTITY = ("/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/random/uuid",
             "/proc/self/mounts", "/proc/self/mountinfo", "/proc/self/maps",
             "/proc/self/auxv", "/proc/self/exe", "/proc/self/cmdline", "/proc/mounts",
             "/proc/version", "/proc/sys/kernel/osrelease", "/proc/sys/vm/overcommit_memory",
             "/proc/sys/kernel/pid_max", "/etc/ld.so.cache", "/etc/os-release",
             "/usr/lib/os-release", "/etc/machine-id", "/sys/devices", "/sys/bus",
             "/sys/kernel/mm/transparent_hugepage")
_SELF = re.compile(r"^/proc/(\d+)(?=/|$)")
#: installed packages' metadata (entry points, versions), which plugin lookups read
_METADATA = re.compile(r"/[^/]+\.(dist-info|egg-info)(/|$)")
#: standard-library modules that open files on their caller's behalf: the caller asks
_PASS_THROUGH = frozenset({"pathlib", "pathlib._local", "pathlib._abc", "io", "_pyio",
                           "codecs", "os", "shutil", "tempfile", "glob", "fileinput",
                           "genericpath", "posixpath", "gzip", "bz2", "lzma", "zipfile",
                           "tarfile", "contextlib", "functools", "linecache", "tokenize"})
#: modules that read code and package metadata for the import system and tracebacks:
#: only they may read ``.py``/``.pth``/``*.dist-info`` files outside the tool's roots (a
#: path the model chose, passed to ``configparser`` or a data library, may not)
_CODE_READERS = ("importlib", "pkgutil", "zipimport", "site", "sysconfig", "inspect",
                 "traceback", "warnings", "pkg_resources", "importlib_metadata",
                 "importlib_resources", "setuptools", "_distutils_hack", "pluggy", "pydoc",
                 "doctest")
_HERE = os.path.realpath(__file__)


def _self_path(path: str) -> str:
    """``/proc/<our pid>/x`` as ``/proc/self/x`` (another pid stays as it is)."""
    m = _SELF.match(path)
    if m and int(m.group(1)) == os.getpid():
        return "/proc/self" + path[m.end():]
    return path


def _model_caches() -> tuple[str, ...]:
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    found = [os.environ.get(v) for v in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                                         "TRANSFORMERS_CACHE", "SENTENCE_TRANSFORMERS_HOME",
                                         "TORCH_HOME")]
    found += [os.path.join(xdg, n) for n in ("huggingface", "torch", "ledgerflow")]
    return tuple(sorted({os.path.realpath(f) for f in found if f}))


_roots_cache: tuple[tuple[object, int], tuple[str, ...]] = (((), -1), ())


def _import_roots() -> tuple[str, ...]:
    """Where importable code lives: ``sys.path`` folders, the interpreter's prefixes, and
    the folders of imported top-level packages and modules (editable installs map
    packages with an import hook, not a ``sys.path`` entry)."""
    global _roots_cache
    key = (tuple(sys.path), len(sys.modules))   # a changed entry, not only a count
    if _roots_cache[0] == key:
        return _roots_cache[1]
    found = {os.path.realpath(p) for p in sys.path
             if isinstance(p, str) and p and os.path.isdir(p)} | set(_PREFIXES)
    for name, mod in list(sys.modules.items()):
        if "." in name or mod is None:
            continue
        for where in getattr(mod, "__path__", None) or ():
            if isinstance(where, str):
                found.add(os.path.realpath(where))
        file = getattr(mod, "__file__", None)
        if isinstance(file, str):
            found.add(os.path.dirname(os.path.realpath(file)))
    roots = tuple(sorted(found))
    _roots_cache = (key, roots)
    return roots


def _is_machine_fact(path: str) -> bool:
    return within(_self_path(path), _SYSTEM)


def _reads_code(asker: str) -> bool:
    """True for the import system and the modules that read code for it (tracebacks)."""
    return asker == "<frozen>" or any(asker == m or asker.startswith(m + ".")
                                      for m in _CODE_READERS)


def _importing(g: Guard) -> bool:
    """True while the tool is importing a module (the import system is on the stack
    above the tool's own frames): that module and its libraries read their files then."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code.co_filename
        if code.startswith("<frozen importlib"):
            return True
        if g.code and os.path.realpath(code) in g.code:
            return False            # the tool's own frame: whatever it asked, not an import
        frame = frame.f_back
    return False


def _own_package(path: str, asker: str) -> bool:
    """True when ``path`` is in the folder of the asking module's top-level package (a
    library reading its own source, as ``transformers`` does to list its models)."""
    top = sys.modules.get(asker.partition(".")[0])
    where = [*(getattr(top, "__path__", None) or ())] if top is not None else []
    return within(path, tuple(os.path.realpath(w) for w in where if isinstance(w, str)))


def _is_runtime(path: str, asker: str | None = "<frozen>", g: Guard | None = None) -> bool:
    """A file the runtime itself reads: code, metadata, identity files, model caches.

    Code and package metadata only for the import system and :data:`_CODE_READERS`,
    during an import, or from the asking library's own package folder.
    """
    path = _self_path(path)
    if within(path, _IDENTITY):
        return True
    if within(path, _model_caches()):
        return os.path.basename(path) not in ("token", "stored_tokens")
    if path.endswith(_CODE) or _METADATA.search(path):
        return asker is not None and (within(path, _PREFIXES) or within(
            path, _import_roots())) and (_reads_code(asker) or _own_package(path, asker)
                                         or (g is not None and _importing(g)))
    return within(path, _PREFIXES)


def _is_code_dir(path: str) -> bool:
    """A folder the import system lists: on ``sys.path``, or a package."""
    if os.path.isfile(os.path.join(path, "__init__.py")):
        return True
    return any(path == os.path.realpath(p or ".") for p in sys.path if isinstance(p, str))


def _asker(g: Guard) -> str | None:
    """The module of the nearest asking frame (``"<frozen>"``: the import system), or
    None when it is the tool's own code (see the module doc)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code.co_filename
        name = frame.f_globals.get("__name__")
        if code == __file__ or os.path.realpath(code) == _HERE or name in _PASS_THROUGH:
            frame = frame.f_back
            continue
        if code.startswith("<frozen"):
            return "<frozen>"
        real = os.path.realpath(code)
        if real in g.code if g.code else not within(real, _PREFIXES):
            return None
        return name if isinstance(name, str) else "?"
    return None


def _runtime_asks(g: Guard) -> bool:
    """True when the nearest asking frame is not the tool's own code."""
    return _asker(g) is not None


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
        fresh = bool(isinstance(mode, str) and "x" in mode) or bool(   # a new file only
            isinstance(flags, int) and flags & (os.O_EXCL | getattr(os, "O_TMPFILE", 0)))
        _path(g, path, writes, "open", fresh=fresh)
    elif event in _LIST:
        path = _real(args[0] if args and args[0] is not None else ".")
        if path is not None and not (within(path, g.reads + g.writes) or (
                (_is_code_dir(path) or _is_runtime(path)) and _runtime_asks(g))):
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
    elif event == "sqlite3.connect" and args:       # C code opens it: no open event
        path = _sqlite_path(args[0])
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


def _sqlite_path(database: Any) -> str | None:
    """The file ``sqlite3.connect(database)`` opens (read-write), or None (in memory)."""
    if isinstance(database, bytes):
        database = os.fsdecode(database)
    if not isinstance(database, (str, os.PathLike)):
        return None
    name = os.fspath(database)
    if name.startswith("file:"):                # a URI: file:path?mode=ro
        name = name[5:].split("?", 1)[0].split("#", 1)[0]
        if name.startswith("//"):
            name = "/" + name[2:].split("/", 1)[-1]
    if name in ("", ":memory:"):
        return None
    return _real(name)


#: what the runtime may do in the temporary folder: make new files and folders, remove them
_SCRATCH = frozenset({"open", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree"})


def _runtime_writes(g: Guard, path: str, event: str, fresh: bool) -> bool:
    """A library's scratch file (a new temp file, ``tempfile``'s probe) or its model cache."""
    if within(path, _model_caches()):
        return os.path.basename(path) not in ("token", "stored_tokens") and _runtime_asks(g)
    # opening the folder itself for writing makes an unnamed file in it (O_TMPFILE)
    if event not in _SCRATCH or (event == "open" and not fresh and not os.path.isdir(path)):
        return False
    return within(path, _temp_dirs()) and _runtime_asks(g)


def _temp_dirs() -> tuple[str, ...]:
    """The folders :func:`tempfile.gettempdir` may choose, found without calling it: the
    hook may run inside its probe, which holds the lock gettempdir takes."""
    found = [tempfile.tempdir] + [os.environ.get(v) for v in ("TMPDIR", "TEMP", "TMP")]
    found += ["/tmp", "/var/tmp", "/usr/tmp"]
    return tuple(sorted({os.path.realpath(f) for f in found if f}))


def _path(g: Guard, path: str, writes: bool, event: str, *, fresh: bool = False) -> None:
    if writes:
        if within(path, g.writes) or _runtime_writes(g, path, event, fresh):
            return
        g.refuse("path_not_allowed", f"tool {g.tool!r} may not write {path} ({event}); "
                 f"its write roots: {', '.join(g.writes) or 'none'}")
    if within(path, g.reads + g.writes) or _is_machine_fact(path) or \
            not os.path.exists(path):
        return                  # (a missing file reads nothing: libraries probe paths)
    asker = _asker(g)
    if asker is not None and _is_runtime(path, asker, g):
        return                  # the import system or a library, not the tool's own code
    g.refuse("path_not_allowed", f"tool {g.tool!r} may not read {path} ({event}); "
             f"its roots: {', '.join(g.reads + g.writes) or 'none'}")


def _under(g: Guard, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under guard ``g`` in whatever thread calls it."""
    def run(*args: Any, **kwargs: Any) -> Any:
        token = _active.set(g)
        try:
            return fn(*args, **kwargs)
        finally:
            _active.reset(token)
    return run


_thread_start = threading.Thread.start
_bare_start = _thread.start_new_thread
_pool_submit = concurrent.futures.ThreadPoolExecutor.submit
_POOL_WORKER = getattr(concurrent.futures.thread, "_worker", None)


def _start(self: threading.Thread) -> None:
    """``Thread.start``: a thread started under a guard runs its whole life under it
    (not a pool's worker: :func:`_submit` guards the work it is given)."""
    g = _active.get()
    if g is not None and getattr(self, "_target", None) is not _POOL_WORKER:
        self.run = _under(g, self.run)          # type: ignore[method-assign]
    _thread_start(self)


def _start_new_thread(fn: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any] | None = None) -> int:
    """``_thread.start_new_thread``, the guard carried into the thread."""
    g = _active.get()
    run = fn if g is None else _under(g, fn)
    return _bare_start(run, args) if kwargs is None else _bare_start(run, args, kwargs)


def _submit(self: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any], /,
            *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
    """``ThreadPoolExecutor.submit``: work submitted under a guard runs under it."""
    g = _active.get()
    return _pool_submit(self, fn if g is None else _under(g, fn), *args, **kwargs)


def install() -> None:
    """Install the audit hook and the thread hand-over (once per process; for good)."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)
            threading.Thread.start = _start             # type: ignore[method-assign]
            _thread.start_new_thread = _start_new_thread
            setattr(concurrent.futures.ThreadPoolExecutor, "submit", _submit)  # noqa: B010
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
