"""Helper programs for the program-task tests, written into a temp dir as files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

#: main ignores TERM, forks a TERM-ignoring child and a daemon that called setsid
#: (its parent exited, so it is an orphan); each writes its pid, then all sleep.
STUBBORN = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = sys.argv[1]
def note(role):
    with open(out, "a") as fh:
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
print("all started", flush=True)
while True:
    time.sleep(0.1)
'''

DUMP_ARGV = '''
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": os.environ.get("LEDGERFLOW_PARAM_NAME")}))
'''


@pytest.fixture
def helpers(tmp_path: Path) -> Path:
    """A folder with the helper scripts (``stubborn.py``, ``dump_argv.py``)."""
    folder = tmp_path / "helpers"
    folder.mkdir()
    (folder / "stubborn.py").write_text(textwrap.dedent(STUBBORN))
    (folder / "dump_argv.py").write_text(textwrap.dedent(DUMP_ARGV))
    return folder
