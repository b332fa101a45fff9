"""The bubblewrap sandbox of a program: its argv, and the check that it holds.

Whatever user starts it (root in a container or CI included), the sandbox
runs the program in a **new user namespace with every capability dropped**
(``--unshare-user --cap-drop ALL --disable-userns``), with its own pid, IPC
and UTS namespaces, ``--die-with-parent`` and a new session. Root inside is
therefore powerless: it cannot remount ``/`` read-write, mount anything, or
write to a read-only bind. Before the first sandboxed program of a process,
:func:`check` runs bubblewrap once with those options and reads the
capabilities and the uid map inside: if the user namespace cannot be made or
a capability is left, :class:`SandboxUnavailable` is raised and nothing runs
(never a weaker sandbox).

The file system view (``view``):

* ``"host"`` (default): the host's ``/`` read-only, a private ``/tmp`` (the
  driver's Python installation stays seen, a venv under ``/tmp`` too), a
  fresh ``/dev`` and ``/proc``; the working directory and ``inputs`` visible,
  ``writable`` paths (and the folders of ``outputs``) writable, ``read_only``
  paths kept read-only even inside writable ones. Everything else the user may
  read stays readable.
* ``"declared"``: only the operating system (``/usr``, ``/bin``, ``/lib*``,
  ``/sbin``, a few files of ``/etc`` a program needs to run: no
  ``/etc/shadow``), the Python installation of the driver, and the declared
  paths (``inputs``, ``read_only``, ``writable``, the folders of ``outputs``,
  and ``cwd`` when given; an undeclared working directory is an empty
  folder). Nothing else of ``/home``, ``/root``, ``/srv``, ``/var`` or ``/run``.

``network=False`` adds ``--unshare-net`` (a loopback of its own; abstract
Unix sockets are per network namespace, so the host's are gone too) and hides
the usual places of host Unix sockets: ``/run`` (and ``/var/run``), ``/tmp``,
``/var/tmp`` are empty there. A socket file elsewhere on the host stays
reachable in the ``"host"`` view; use ``view="declared"`` to be sure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence

from .errors import SandboxUnavailable

__all__ = ["ISOLATION", "VIEWS", "bwrap_argv", "check"]

#: Namespaces and privileges of every sandbox, whoever starts it.
ISOLATION = ("--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--unshare-pid",
             "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session")
VIEWS = ("host", "declared")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What of /etc a program needs to run: dynamic loader, users, names, time, TLS roots.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group",
        "nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf", "localtime",
        "timezone", "ssl", "ca-certificates", "mime.types", "locale.alias", "os-release")
_SOCKET_DIRS = ("/run", "/var/run", "/var/tmp")

_CHECKED: dict[str, str | None] = {}       # bwrap path -> None (holds) or why not
_LOCK = threading.Lock()


def find(name: str) -> str:
    """The bubblewrap executable, or :class:`SandboxUnavailable`."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(
            f"program {name!r} asks for sandbox='bwrap' but bubblewrap is not "
            "installed (apt-get install bubblewrap)")
    return exe


def _probe(exe: str) -> str | None:
    """Run bubblewrap once as programs run; None if it holds, else the reason."""
    cat = shutil.which("cat") or "/bin/cat"
    argv = [exe, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *ISOLATION,
            "--", cat, "/proc/self/status", "/proc/self/uid_map"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, env={"PATH": os.defpath})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not be run: {exc}"
    if res.returncode != 0:
        why = (res.stderr.strip() or f"exit code {res.returncode}").splitlines()[-1]
        return f"bubblewrap cannot make a user namespace without capabilities here: {why}"
    caps = {k: v.strip() for k, _, v in (ln.partition(":") for ln in res.stdout.splitlines())
            if k.startswith("Cap")}
    left = [k for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb") if int(caps.get(k, "1"), 16)]
    if left:
        return f"capabilities are left inside the sandbox ({', '.join(left)})"
    maps = [ln.split() for ln in res.stdout.splitlines() if ln.split()[:1] and
            all(p.isdigit() for p in ln.split()) and len(ln.split()) == 3]
    if not maps or any(int(m[2]) > 65536 for m in maps):
        return "the sandbox did not get a user namespace of its own"
    return None


def check(name: str) -> str:
    """The bubblewrap executable, once it is known to isolate as documented.

    Raises :class:`SandboxUnavailable` (with the reason and a hint) otherwise.
    """
    exe = find(name)
    with _LOCK:
        if exe not in _CHECKED:
            _CHECKED[exe] = _probe(exe)
        why = _CHECKED[exe]
    if why is not None:
        raise SandboxUnavailable(
            f"program {name!r} asks for sandbox='bwrap', which cannot be made safe here: "
            f"{why}; it was not run (hint: allow unprivileged user namespaces, e.g. "
            "sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces>0, or "
            "run the container with a seccomp profile that permits them)")
    return exe


def _runtime() -> list[str]:
    """The driver's Python installation (a venv and its base), for the declared view."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    return sorted(p for p in found if p and p != "/" and not p.startswith(_SYSTEM))


def _system_view() -> list[str]:
    """Mounts of the operating system for the declared view (symlinks kept as links)."""
    args: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in _ETC:
        path = "/etc/" + name
        if os.path.lexists(path):
            args += ["--ro-bind-try", path, path]
    return args


def _no_escape(writable: Sequence[str], inside: Sequence[str]) -> None:
    """Refuse a path of ``inside`` within a writable one whose real place is outside it.

    A program may replace ``out/res`` (inside its writable ``out``) with a symlink
    to ``/etc``; the next attempt would bind ``/etc`` read-write (or, for a
    ``read_only`` path or an input, show a host folder the view hides).
    """
    for inner in inside:
        for outer in writable:
            o = outer.rstrip("/")
            if inner.rstrip("/") != o and inner.startswith(o + "/"):
                real, real_outer = os.path.realpath(inner), os.path.realpath(outer)
                if real != real_outer and not real.startswith(real_outer.rstrip("/") + "/"):
                    raise SandboxUnavailable(
                        f"the path {inner} inside the writable {outer} leads to "
                        f"{real}, outside it (a symlink there, which a program may have "
                        "left); it was not run (hint: remove the link)")


def bwrap_argv(exe: str, *, cwd: str, visible: Sequence[str], writable: Sequence[str],
               read_only: Sequence[str], network: bool, view: str) -> list[str]:
    """The bubblewrap command line (up to and with ``--``) for one program attempt.

    ``visible`` paths are bound read-only, ``writable`` ones read-write (made
    if missing), ``read_only`` ones read-only even inside writable ones.
    """
    for path in writable:
        os.makedirs(path, exist_ok=True)
    _no_escape(writable, [*writable, *read_only, *visible])
    if view == "declared":
        args = [exe, *_system_view()]
    else:
        args = [exe, "--ro-bind", "/", "/"]
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *ISOLATION]
    for path in _runtime():     # over the private /tmp: a venv under /tmp is seen too
        args += ["--ro-bind-try", path, path]
    if not network:
        args.append("--unshare-net")
        for path in _SOCKET_DIRS:
            if view == "host" and os.path.isdir(path) and not os.path.islink(path):
                args += ["--tmpfs", path]
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
    if view == "declared" and cwd not in visible:
        args += ["--dir", cwd]        # an undeclared working directory: there, but empty
    return [*args, "--chdir", cwd, "--"]
