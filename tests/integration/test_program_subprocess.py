"""A program task's tree dies with a SIGKILLed driver (inline and threads run it there)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.program.conftest import STUBBORN
from tests.program.proctools import alive, kill_all, roles
from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

DRIVER = '''
import sys
from ledgerflow import pipeline
from ledgerflow import program

stubborn = program("stubborn", [sys.executable, sys.argv[1], sys.argv[2]], grace=1)

@pipeline
def p():
    return stubborn()

p.run(store=sys.argv[3], executor=sys.argv[4])
'''


@pytest.mark.parametrize("executor", ["inline", "threads"])
def test_the_program_tree_dies_with_its_driver(tmp_path: Path, executor: str) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent(STUBBORN))
    pids = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(script), str(pids),
                               str(tmp_path / "ledger.duckdb"), executor], env=env)
    try:
        wait_until(lambda: len(roles(pids)) == 3, what="the whole tree to start")
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        # the supervisor saw its lifeline close and killed the tree at once
        wait_until(lambda: not any(alive(p) for p in roles(pids).values()), timeout=5,
                   what="the program's tree to die with the driver")
    finally:
        if driver.poll() is None:
            driver.kill()
        kill_all(roles(pids))
