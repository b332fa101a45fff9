"""How a sandboxed program ended, told from inside the sandbox (bubblewrap loses it).

Bubblewrap exits with the program's code, or ``128 + n`` when a signal ``n``
ended it, and with ``137`` when its own init is SIGKILLed from the host: a
signal, an ``exit(137)`` and a killed sandbox look the same from outside, so a
limit hit (SIGXCPU) could not be named and a sandbox that ended early could
pass for the program's own exit. In the sandbox the program therefore runs
under a few lines of stdlib Python (:data:`CODE`, ``python -I -S -c``) that
apply the rlimits, exec it, wait for it and write its **raw wait status** to a
pipe the driver holds (``S <status>``, or ``E <json message>`` when it could
not be started). The pipe is closed on exec: the program cannot write to it.

:meth:`Report.settle` turns what the supervisor saw (bubblewrap's status)
into the program's: the reported status when there is one; else, when
bubblewrap says ``128 + n``, the signal ``n`` with a note that the sandbox
ended before the program reported (its init or the reporter was killed); and
a sandbox that exits 0 without a report is a failure, never a success.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal

from .supervise import Ended

__all__ = ["CODE", "Report"]

#: Run inside the sandbox as ``python -I -S -c CODE FD RLIMITS -- ARGV...``.
CODE = r"""
import json, os, signal, sys
fd, limits, argv = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[4:]
os.set_inheritable(fd, False)
stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
for s in stops:
    signal.signal(s, signal.SIG_IGN)
exe = argv[0]
if "/" not in exe:                 # found now: after the rlimits, allocate as little as can be
    for d in os.get_exec_path():
        if os.path.isfile(os.path.join(d, exe)) and os.access(os.path.join(d, exe), os.X_OK):
            exe = os.path.join(d, exe)
            break
plan = []
if limits:
    import resource
    for name, soft, hard in limits:
        which = getattr(resource, name)
        cur = resource.getrlimit(which)[1]
        if cur != resource.RLIM_INFINITY:
            hard = min(hard, cur)
        plan.append((which, (min(soft, hard), hard)))
defaults = (*stops, signal.SIGPIPE, signal.SIGXFSZ)        # Python ignores the last two
pid = os.fork()
if pid == 0:
    try:
        for s in defaults:
            signal.signal(s, signal.SIG_DFL)
        for which, pair in plan:
            resource.setrlimit(which, pair)
        os.execv(exe, argv)
    except BaseException as e:
        os.write(fd, ("E " + json.dumps(f"{type(e).__name__}: {e}") + "\n").encode())
        os._exit(127)
status = os.waitpid(pid, 0)[1]
os.write(fd, f"S {status}\n".encode())
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


class Report:
    """The pipe a sandboxed program's status comes back on (driver side)."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def argv(self, python: str, rlimits: list[tuple[str, int, int]]) -> list[str]:
        """The reporter's command line; the program's argv follows it."""
        return [python, "-I", "-S", "-c", CODE, str(self.w), json.dumps(rlimits), "--"]

    def started(self) -> None:
        """The supervisor holds the writing end now: drop the driver's."""
        if self.w >= 0:
            os.close(self.w)
            self.w = -1

    def _read(self) -> tuple[int | None, str]:
        os.set_blocking(self.r, False)
        data = b""
        try:
            while chunk := os.read(self.r, 4096):
                data += chunk
        except BlockingIOError:
            pass
        status, error = None, ""
        for line in data.decode("utf-8", "replace").splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "S" and rest.strip().isdigit():
                status = int(rest)
            elif kind == "E":
                try:
                    error = str(json.loads(rest))
                except ValueError:
                    error = rest
        return status, error

    def settle(self, ended: Ended) -> Ended:
        """``ended`` (bubblewrap's status) as the program's own (see the module doc)."""
        if ended.stopped or ended.exec_error or ended.status is None:
            return ended
        status, error = self._read()
        if error:
            return dataclasses.replace(ended, exec_error=error)
        if status is not None:
            return dataclasses.replace(ended, status=status)
        code = os.waitstatus_to_exitcode(ended.status)
        if code > 128 and (code - 128) in signal.valid_signals():
            return dataclasses.replace(   # a raw wait status of "killed by signal n"
                ended, status=code - 128,
                note="the sandbox ended before the program reported how it ended "
                     "(its init or the reporter was killed)")
        if code == 0:
            return dataclasses.replace(
                ended, status=1 << 8,
                note="the sandbox exited 0 but the program never reported how it ended")
        return ended

    def close(self) -> None:
        self.started()
        os.close(self.r)
