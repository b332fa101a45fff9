"""Process identity: a pid is alive only with its start time, and a zombie is not alive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ledgerflow.procs import alive, children_table, pid_alive, proc_start

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")


def test_a_running_process_is_alive_with_its_own_start_time_only() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = proc_start(child.pid)
        assert start is not None and start.isdigit()
        assert alive(child.pid) and pid_alive(child.pid) and pid_alive(child.pid, start)
        assert not pid_alive(child.pid, str(int(start) + 1))       # a reused pid is another
        children, live = children_table()
        assert child.pid in children[os.getpid()] and child.pid in live
    finally:
        child.kill()
        child.wait()
    assert proc_start(child.pid) is None and not alive(child.pid)
    assert not pid_alive(child.pid, start)


def test_a_zombie_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)     # exited, not reaped
        assert os.path.exists(f"/proc/{child.pid}")
        assert not alive(child.pid) and proc_start(child.pid) is None
        assert not pid_alive(child.pid)
        assert child.pid not in children_table()[1]
    finally:
        child.wait()


def test_this_process_is_alive() -> None:
    assert pid_alive(os.getpid(), proc_start(os.getpid()))
