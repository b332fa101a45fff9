"""The bubblewrap sandbox holds whoever starts it (root in CI and containers, a normal user).

Each test runs real programs under the real bubblewrap: the remount of ``/`` and
a write to the host's ``/etc`` are refused, no capability is left, the
environment is not inherited, host Unix sockets are out of reach without
network, and a sandbox that cannot be made so is refused, never weakened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerflow import program
from ledgerflow.programs import ProgramError, SandboxUnavailable, descendants, supervisor_pids
from tests.program.proctools import PY
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install "
                                "bubblewrap; ./dev test installs it)")

ROOT = Path(__file__).resolve().parents[2]

#: The attack of the review: remount / read-write, mount over /etc, write into /etc.
ATTACK = ('mount -o remount,rw / 2>/dev/null; echo "remount $?"; '
          'mount -t tmpfs none /etc 2>/dev/null; echo "mount $?"; '
          '(echo owned > "$LEDGERFLOW_PARAM_TARGET") 2>/dev/null; echo "write $?"; '
          'grep "^Cap\\(Eff\\|Prm\\|Bnd\\)" /proc/self/status')


def _verdict(stdout: str) -> dict[str, str]:
    """``{"remount": code, "mount": code, "write": code, "CapEff": hex, ...}``."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        key, _, value = line.replace(":", " ").partition(" ")
        out[key] = value.strip()
    return out


def _assert_refused(stdout: str, target: Path) -> None:
    got = _verdict(stdout)
    assert got["remount"] != "0" and got["mount"] != "0", stdout
    assert got["write"] != "0", stdout
    assert {got["CapEff"], got["CapPrm"], got["CapBnd"]} == {"0000000000000000"}, stdout
    assert not target.exists()


@pytest.fixture
def target() -> Iterator[Path]:
    """A file in the host's /etc the attack tries to create (removed if it ever is)."""
    path = Path("/etc") / f"ledgerflow-sandbox-probe-{uuid.uuid4().hex[:12]}"
    yield path
    if path.exists():
        path.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (as in CI and containers)")
def test_as_root_the_program_cannot_remount_or_write_etc(target: Path) -> None:
    hostname = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else b""
    attack = program("attack", ["sh", "-c", ATTACK], sandbox="bwrap")
    res = attack(target=str(target))
    _assert_refused(res["stdout"], target)
    if hostname:
        assert Path("/etc/hostname").read_bytes() == hostname
    # the mount table of the host still has / as it was (nothing was remounted here)
    assert subprocess.run(["sh", "-c", f": > {target}"], capture_output=True).returncode == 0
    target.unlink()             # the host itself can write there: the refusal was the sandbox's


USER = "lfsandbox"

DRIVER = '''
import json, sys
from ledgerflow import program
attack = program("attack", ["sh", "-c", sys.argv[2]], sandbox="bwrap")
print(json.dumps(attack(target=sys.argv[1])))
'''


def _normal_user() -> str:
    """A normal user to run the driver as (made with useradd if missing), or skip."""
    if os.geteuid() != 0:
        pytest.skip("runs the driver as another user: needs root to switch (runuser)")
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed")
    probe = subprocess.run(["id", "-u", USER], capture_output=True)
    if probe.returncode != 0:
        if shutil.which("useradd") is None:
            pytest.skip("no useradd to create a normal user")
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", USER], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"could not create a normal user: {made.stderr.strip()}")
    return USER


def _python_for(user: str, env: dict[str, str]) -> str:
    """A Python the user can run that imports this ledgerflow, or skip."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if not os.path.exists(exe):
            continue
        ok = subprocess.run(["runuser", "-u", user, "--", exe, "-c", "import ledgerflow.programs"],
                            env=env, capture_output=True, timeout=120)
        if ok.returncode == 0:
            return exe
    pytest.skip(f"no Python that user {user} may run imports ledgerflow (the venv's "
                "interpreter is not readable by other users)")


def test_as_a_normal_user_the_same_attack_is_refused(target: Path) -> None:
    user = _normal_user()
    folder = Path(tempfile.mkdtemp(prefix="lf-sandbox-user-"))
    try:
        folder.chmod(0o755)
        (folder / "driver.py").write_text(textwrap.dedent(DRIVER))
        site = [p for p in sys.path if p.endswith("site-packages")]
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(folder),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT), *site])}
        exe = _python_for(user, env)
        res = subprocess.run(["runuser", "-u", user, "--", exe, str(folder / "driver.py"),
                              str(target), ATTACK], env=env, cwd=folder, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        _assert_refused(json.loads(res.stdout.strip().splitlines()[-1])["stdout"], target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_environment_is_not_inherited_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LF_TEST_SECRET", "s3cret")
    show = ["sh", "-c", 'echo "[$LF_TEST_SECRET] [$LEDGERFLOW_ATTEMPT]"']
    assert program("plain", show, sandbox="bwrap")()["stdout"] == "[] [1]\n"
    assert program("given", show, sandbox="bwrap", env={"LF_TEST_SECRET": "passed"})()[
        "stdout"] == "[passed] [1]\n"
    assert program("asked", show, sandbox="bwrap", inherit_env=True)()[
        "stdout"] == "[s3cret] [1]\n"
    assert program("unsandboxed", show)()["stdout"] == "[s3cret] [1]\n"   # as before


CONNECT = '''
import socket, sys
for address in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(address.replace("@", "\\0", 1))
        print("connected")
    except OSError as e:
        print("refused", e.errno)
    finally:
        s.close()
'''


@pytest.fixture
def host_sockets() -> Iterator[tuple[str, str]]:
    """A Unix socket listening under the host's /run, and an abstract one."""
    if not os.access("/run", os.W_OK):
        pytest.skip("cannot make a socket under /run here")
    folder = Path(tempfile.mkdtemp(prefix="lf-sock-", dir="/run"))
    folder.chmod(0o755)
    name = "@lf-test-" + uuid.uuid4().hex[:12]
    with socket.socket(socket.AF_UNIX) as on_run, socket.socket(socket.AF_UNIX) as abstract:
        on_run.bind(str(folder / "s"))
        on_run.listen(4)
        abstract.bind("\0" + name[1:])
        abstract.listen(4)
        try:
            yield str(folder / "s"), name
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def test_without_network_no_host_unix_socket_is_reachable(host_sockets: tuple[str, str],
                                                          tmp_path: Path) -> None:
    script = tmp_path / "connect.py"
    script.write_text(CONNECT)
    on_run, abstract = host_sockets
    cut = program("cut", [PY, str(script), on_run, abstract], sandbox="bwrap", network=False,
                  read_only=[str(script)])
    wired = program("wired", [PY, str(script), on_run, abstract], sandbox="bwrap",
                    read_only=[str(script)])
    assert [ln.split()[0] for ln in cut()["stdout"].splitlines()] == ["refused", "refused"]
    assert wired()["stdout"] == "connected\nconnected\n"     # the same program, with network


LOOK = '''
import os, sys
for path in sys.argv[1:]:
    print(path, os.path.exists(path))
'''


def test_the_declared_view_shows_only_the_system_and_the_declared_paths(tmp_path: Path) -> None:
    script = tmp_path / "look.py"
    script.write_text(LOOK)
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("x")
    paths = ["/etc/shadow", "/var", "/home", str(ROOT / "README.md"), str(data / "in.txt"),
             "/usr/bin/env", "/etc/passwd"]
    look = program("look", [PY, str(script), *paths], sandbox="bwrap", view="declared",
                   read_only=[str(script)], inputs=[str(data)])
    seen = dict(line.rsplit(" ", 1) for line in look()["stdout"].splitlines())
    assert seen == {"/etc/shadow": "False", "/var": "False", "/home": "False",
                    str(ROOT / "README.md"): "False", str(data / "in.txt"): "True",
                    "/usr/bin/env": "True", "/etc/passwd": "True"}
    host = program("host", [PY, str(script), *paths], sandbox="bwrap", read_only=[str(script)],
                   inputs=[str(data)])
    assert "README.md True" in host()["stdout"]            # the default view: the host's /
    here = program("here", [PY, str(script), str(ROOT / "README.md")], sandbox="bwrap",
                   view="declared", read_only=[str(script)], cwd=str(ROOT))
    assert here()["stdout"] == f"{ROOT / 'README.md'} True\n"   # a declared cwd is seen


def _fake_bwrap(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "bwrap"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return folder


def test_a_bwrap_that_cannot_make_a_user_namespace_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    bin_dir = _fake_bwrap(tmp_path / "no-userns",
                          'echo "bwrap: No permissions to create new namespace" >&2; exit 1\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    touch = program("touch", ["touch", str(marker)], sandbox="bwrap")
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
        touch()
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="capabilities are left only for root")
def test_a_bwrap_that_leaves_capabilities_is_refused(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    # ignores every option and runs the command as it is: root keeps its capabilities
    bin_dir = _fake_bwrap(tmp_path / "weak", 'while [ "$1" != "--" ]; do shift; done\n'
                                             'shift\nexec "$@"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    touch = program("touch", ["touch", str(marker)], sandbox="bwrap")
    with pytest.raises(SandboxUnavailable, match="capabilities are left"):
        touch()
    assert not marker.exists()


def test_killing_the_sandbox_init_is_a_failure_never_exit_0(tmp_path: Path) -> None:
    started = tmp_path / "out" / "started"
    inside = program("inside", ["sh", "-c", "kill -KILL 1; kill -TERM 1; exit 7"],
                     sandbox="bwrap")
    with pytest.raises(ProgramError, match="exited with code 7"):   # init survives it
        inside()
    sleeper = program("sleeper", ["sh", "-c", f": > {started}; sleep 60"], sandbox="bwrap",
                      writable=[str(started.parent)], timeout=120, grace=1)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            sleeper()
        except BaseException as exc:          # the test reads it below
            failure.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait_until(started.exists, what="the sandboxed program to start")
        (sup,) = supervisor_pids()
        tree = descendants(sup)               # outer bwrap, its init, sh, sleep
        outer = tree[0]
        init = next(p for p in tree if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1]
                    .split()[1] == str(outer))
        os.kill(init, signal.SIGKILL)         # from the host: the sandbox's init dies
    finally:
        worker.join(60)
    assert len(failure) == 1 and isinstance(failure[0], ProgramError), failure
    assert failure[0].exit_code is None and failure[0].signal == "SIGKILL", failure
    assert "before the program reported how it ended" in str(failure[0])
