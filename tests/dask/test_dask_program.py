"""Program tasks on Dask: a timeout or a cancel stops the whole tree before the attempt ends."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ledgerflow import pipeline, program
from ledgerflow_dask import DaskExecutor
from tests.waiting import wait_until

pytestmark = [pytest.mark.dask, pytest.mark.timeout(120)]

STUBBORN = textwrap.dedent('''
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    def note(role):
        with open(sys.argv[1], "a") as fh:
            fh.write(f"{role} {os.getpid()}\\n")
    note("main")
    if os.fork() == 0:
        note("child")
        while True:
            time.sleep(0.1)
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            note("setsid-grandchild")
            while True:
                time.sleep(0.1)
        os._exit(0)
    os.waitpid(middle, 0)
    while True:
        time.sleep(0.1)
''')


def _pids(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    return {r: int(p) for r, p in (ln.split() for ln in path.read_text().splitlines())}


def _alive(pid: int) -> bool:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] not in (b"Z", b"X")


@pytest.mark.parametrize("stop", ["timeout", "cancel"])
def test_the_program_tree_is_gone_when_the_attempt_ends(
        tmp_path: Path, store: str, shared_client: Any, stop: str) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pids = tmp_path / "pids"
    stubborn = program("stubborn", [sys.executable, str(script), str(pids)], grace=1,
                       timeout=1 if stop == "timeout" else None)

    @pipeline
    def p():
        return stubborn()

    try:
        run = p.run(store=store, executor=DaskExecutor(client=shared_client), wait=False)
        wait_until(lambda: len(_pids(pids)) == 3, what="the whole tree to start")
        asked = time.time()
        if stop == "cancel":
            run.cancel()
        assert run.wait(timeout=60) == ("cancelled" if stop == "cancel" else "failed")
        assert not [r for r, pid in _pids(pids).items() if _alive(pid)]
        [attempt] = run.attempts("stubborn")
        assert attempt["outcome"] == ("cancelled" if stop == "cancel" else "timeout")
        assert float(attempt["ended_at"]) - asked < 3 + (1 if stop == "timeout" else 0)
    finally:
        for pid in _pids(pids).values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
