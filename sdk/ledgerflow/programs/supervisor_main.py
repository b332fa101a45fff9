"""The supervisor of one program attempt: a stdlib-only script, not imported by ledgerflow.

Run as ``python -I -S supervisor_main.py --ledgerflow-program-supervisor CFG``
(see :mod:`ledgerflow.programs.supervise`), with ``CFG`` a JSON object:
``argv`` (the command), ``ctl`` (a pipe fd: EOF means "stop"), ``status``
(a pipe fd for the status lines) and ``rlimits`` (``[name, soft, hard]``).

It makes itself the child subreaper, forks the program into its own process
group with the rlimits applied before ``exec``, and writes status lines:
``P <pid>`` (started), ``E <json message>`` (could not exec), ``X <wait
status> <cpu seconds> <max rss>`` (the program ended). When ``ctl`` reaches
EOF (the task is done, or the process running it died) it SIGKILLs every
process left below it, reaps them and exits. Nothing of ledgerflow is
imported: it must start fast and trust nothing on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:            # no typing import at run time: the supervisor starts per attempt
    from typing import Any

PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)


def become_subreaper() -> None:
    """Orphans of the tree are re-parented to this process, not to init."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:
        pass


def exec_program(cfg: dict[str, Any], err_w: int, keep_closed: tuple[int, ...]) -> None:
    """In the forked child: own group, default signals, rlimits, then exec (never returns)."""
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for s in (*_STOP_SIGNALS, signal.SIGCHLD, signal.SIGXFSZ, signal.SIGXCPU):
            signal.signal(s, signal.SIG_DFL)
        if cfg["rlimits"]:
            import resource
            for name, soft, hard in cfg["rlimits"]:
                which = getattr(resource, name)
                cur = resource.getrlimit(which)[1]
                if cur != resource.RLIM_INFINITY:
                    hard = min(hard, cur)
                resource.setrlimit(which, (min(soft, hard), hard))
        for fd in keep_closed:
            os.close(fd)
        os.execvp(cfg["argv"][0], cfg["argv"])
    except BaseException as e:
        try:
            os.write(err_w, f"{type(e).__name__}: {e}".encode()[:4000])
        finally:
            os._exit(127)


def tree() -> list[int]:
    """Every process below this one (from /proc)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
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


class Supervisor:
    """The parent side: report, reap, and stop the tree when told (or orphaned)."""

    def __init__(self, status_fd: int, pid: int, wake_r: int) -> None:
        self.status_fd = status_fd
        self.pid = pid
        self.wake_r = wake_r
        self.main_done = False

    def say(self, text: str) -> None:
        try:
            os.write(self.status_fd, (text + "\n").encode())
        except OSError:      # the driver is gone: keep going, the tree must still be killed
            pass

    def reap(self) -> bool:
        """Reap every ended child; False once there is none left."""
        while True:
            try:
                p, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if p == 0:
                return True
            if p == self.pid and not self.main_done:
                self.main_done = True
                self.say(f"X {status} {ru.ru_utime + ru.ru_stime:.6f} {ru.ru_maxrss}")

    def watch(self, ctl: int) -> None:
        """Reap as children end, until ``ctl`` reaches EOF."""
        while True:
            self.reap()
            try:
                ready = select.select([ctl, self.wake_r], [], [], 1.0)[0]
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
            if ctl in ready and not os.read(ctl, 64):
                return     # the task is done with us, or the process running it died

    def kill_all(self) -> None:
        """SIGKILL whatever is left below us, reap it."""
        while True:
            for p in tree():
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            if not self.reap():
                return
            select.select([self.wake_r], [], [], 0.05)


def main(argv: list[str]) -> None:
    """Start the program described by ``argv[-1]`` and supervise it (see the docstring)."""
    cfg = json.loads(argv[-1])
    ctl, st = cfg["ctl"], cfg["status"]
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    become_subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w)
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        exec_program(cfg, err_w, (ctl, st, wake_r, wake_w, err_r))
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
    sup = Supervisor(st, pid, wake_r)
    if msg:
        sup.say("E " + json.dumps(msg.decode("utf-8", "replace")))
    else:
        sup.say(f"P {pid}")
    sup.watch(ctl)
    sup.kill_all()


if __name__ == "__main__":
    main(sys.argv)
