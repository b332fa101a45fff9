"""Program tasks under bubblewrap: no network, only declared paths writable, limits hold."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerflow import Limits, TaskTimedOut, pipeline, program
from ledgerflow.programs import LimitExceeded
from tests.program.proctools import PY, alive

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install "
                                "bubblewrap; ./dev test installs it)")

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()\n"
           "    print('connected')\n"
           "except OSError as e:\n"
           "    print('refused', e.errno)\n")

WRITE = ("import sys\n"
         "for path in sys.argv[1:]:\n"
         "    try:\n"
         "        open(path, 'w').write('x')\n"
         "        print('wrote', path)\n"
         "    except OSError as e:\n"
         "        print('denied', path, e.strerror)\n")


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port listening on 127.0.0.1 outside the sandbox."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_without_network_a_local_port_cannot_be_reached(listener: int, tmp_path: Path) -> None:
    script = tmp_path / "connect.py"
    script.write_text(CONNECT)
    # the script lives under /tmp, which is private inside: declare it to see it
    cut = program("cut", [PY, str(script), "{port}"], sandbox="bwrap", network=False,
                  read_only=[str(script)])
    wired = program("wired", [PY, str(script), "{port}"], sandbox="bwrap", network=True,
                    read_only=[str(script)])
    assert cut(port=listener)["stdout"].startswith("refused")
    assert wired(port=listener)["stdout"] == "connected\n"      # the same program, with network


def test_only_declared_paths_are_writable(tmp_path: Path, ledger: str) -> None:
    script = tmp_path / "write.py"
    script.write_text(WRITE)
    out = tmp_path / "out"
    repo_file = Path(__file__).with_name("never-written.txt")
    writer = program("writer", [PY, str(script), "{a}", "{b}", "{c}", "/tmp/private"],
                     sandbox="bwrap", read_only=[str(tmp_path)], writable=[str(out)])

    @pipeline
    def p(a: str, b: str, c: str):
        return writer(a=a, b=b, c=c)

    a, b = str(out / "ok.txt"), str(tmp_path / "outside.txt")
    res = p.run(a, b, str(repo_file), store=ledger, executor="threads").result()
    lines = res["stdout"].splitlines()
    assert lines[0] == f"wrote {a}"
    assert lines[1] == f"denied {b} Read-only file system"
    assert lines[2] == f"denied {repo_file} Read-only file system"
    assert lines[3] == "wrote /tmp/private"                      # a private /tmp
    assert (out / "ok.txt").read_text() == "x"
    assert not Path(b).exists() and not repo_file.exists()
    assert not Path("/tmp/private").exists()


def test_a_memory_limit_hit_inside_the_sandbox_names_the_limit() -> None:
    hog = program("hog", [PY, "-c", "x = bytearray(2 * 1024**3)"], sandbox="bwrap",
                  limits=Limits(memory_mb=400))
    with pytest.raises(LimitExceeded, match=r"memory_mb limit \(memory_mb=400\)") as info:
        hog()
    assert info.value.limit == "memory_mb"


def test_the_sandbox_has_its_own_pid_namespace(tmp_path: Path) -> None:
    ps = program("ps", ["sh", "-c", "ls /proc | grep -c '^[0-9]'"], sandbox="bwrap")
    assert int(ps()["stdout"]) <= 5   # bwrap's init, the reporter, sh, ls, grep: not the host's


def _running_with(marker: str) -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            pass
    return found


def test_a_timeout_stops_the_whole_sandboxed_tree(helpers: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "pids"          # pids inside the sandbox's own namespace
    stubborn = program("stubborn", [PY, str(helpers / "stubborn.py"), str(out)],
                       sandbox="bwrap", read_only=[str(helpers)], writable=[str(out.parent)],
                       timeout=1, grace=1)
    with pytest.raises(TaskTimedOut):
        stubborn()
    assert len(out.read_text().splitlines()) == 3
    assert not [p for p in _running_with(str(out)) if alive(p)]
