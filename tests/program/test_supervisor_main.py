"""The supervisor is a real file: run it by itself and read its status lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ledgerflow.programs.supervise import SUPERVISOR
from ledgerflow.programs.tree import SUPERVISOR_MARK, is_supervisor
from tests.program.proctools import alive
from tests.waiting import wait_until


def _start(argv: list[str]) -> tuple[subprocess.Popen[bytes], int, int]:
    ctl_r, ctl_w = os.pipe()
    st_r, st_w = os.pipe()
    cfg = json.dumps({"argv": argv, "ctl": ctl_r, "status": st_w, "rlimits": []})
    proc = subprocess.Popen([sys.executable, "-I", "-S", SUPERVISOR, SUPERVISOR_MARK, cfg],
                            pass_fds=(ctl_r, st_w), stdout=subprocess.PIPE)
    os.close(ctl_r)
    os.close(st_w)
    return proc, ctl_w, st_r


def _lines(fd: int) -> list[str]:
    with os.fdopen(fd, "rb") as fh:
        return fh.read().decode().splitlines()


def test_it_reports_the_start_and_the_exit_status(tmp_path: Path) -> None:
    proc, ctl_w, st_r = _start(["sh", "-c", "echo hi; exit 5"])
    assert proc.stdout is not None
    assert proc.stdout.read() == b"hi\n"           # the program holds the output pipe
    os.close(ctl_w)                                # done: the supervisor may go
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()
    started, ended = _lines(st_r)
    assert started.startswith("P ") and int(started.split()[1]) > 0
    kind, status, cpu, _rss = ended.split()
    assert kind == "X" and os.waitstatus_to_exitcode(int(status)) == 5 and float(cpu) >= 0


def test_an_argv_that_cannot_run_is_reported() -> None:
    proc, ctl_w, st_r = _start(["/nonexistent/program"])
    os.close(ctl_w)
    assert proc.wait(timeout=60) == 0 and proc.stdout is not None
    proc.stdout.close()
    error, ended = _lines(st_r)
    assert error.startswith("E ") and "FileNotFoundError" in json.loads(error[2:])
    assert os.waitstatus_to_exitcode(int(ended.split()[1])) == 127


def test_eof_on_its_control_pipe_kills_the_tree_left_below_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    proc, ctl_w, st_r = _start(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"])
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(),
               what="the background sleeper's pid")
    sleeper = int(pid_file.read_text())
    assert is_supervisor(proc.pid) and not is_supervisor(sleeper)
    os.close(ctl_w)                                # as when the task's process dies
    assert proc.wait(timeout=60) == 0 and proc.stdout is not None
    proc.stdout.close()
    os.close(st_r)
    assert not alive(sleeper)
