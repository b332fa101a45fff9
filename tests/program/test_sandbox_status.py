"""How a sandboxed program ended is its own: a signal is named, never an exit code or 0.

Bubblewrap exits ``128 + n`` for a program ended by signal ``n`` and ``137`` when
its init is killed, so before the reporter a sandboxed program killed by SIGKILL
read "exited with code 137", a CPU limit was not named, and a missing command was
bwrap's "exit 1". Each test runs the real bubblewrap.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from ledgerflow import Limits, pipeline, program
from ledgerflow.programs import ProgramError, SandboxUnavailable, UnsafeArgument

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.mark.parametrize("sig", ["KILL", "TERM", "SEGV"])
def test_a_signal_that_ends_a_sandboxed_program_is_named(sig: str) -> None:
    killed = program("killed", ["sh", "-c", f"kill -{sig} $$"], sandbox="bwrap")
    with pytest.raises(ProgramError, match=f"was killed by SIG{sig}") as info:
        killed()
    assert info.value.exit_code is None and info.value.signal == f"SIG{sig}"


def test_an_exit_code_above_128_stays_an_exit_code() -> None:
    code = program("code", ["sh", "-c", "exit 137"], sandbox="bwrap", ok_codes=(0, 137))
    assert code()["exit_code"] == 137
    with pytest.raises(ProgramError, match="exited with code 137") as info:
        program("code", ["sh", "-c", "exit 137"], sandbox="bwrap")()
    assert info.value.exit_code == 137 and info.value.signal is None


def test_a_cpu_limit_hit_in_the_sandbox_is_named(ledger: str) -> None:
    spin = program("spin", ["sh", "-c", "while :; do :; done"], sandbox="bwrap",
                   limits=Limits(cpu_s=1), timeout=120)

    @pipeline
    def p():
        return spin()

    run = p.run(store=ledger, executor="threads")
    task = run.status().tasks["spin"]
    assert task.state == "failed"
    assert "hit its cpu_s limit" in (task.error or "") and "SIGXCPU" in (task.error or "")


def test_the_limits_bind_the_program_not_the_sandbox_around_it(tmp_path: Path) -> None:
    # 8 MiB of address space: enough for `true`, not for the Python that reports it
    small = program("small", ["true"], sandbox="bwrap", limits=Limits(memory_mb=8))
    assert small()["exit_code"] == 0
    files = program("files", ["sh", "-c", "ulimit -n"], sandbox="bwrap",
                    limits=Limits(open_files=37))
    assert files()["stdout"] == "37\n"


def test_a_missing_command_in_the_sandbox_could_not_start() -> None:
    missing = program("missing", ["no-such-command-here"], sandbox="bwrap")
    with pytest.raises(ProgramError, match="could not start 'no-such-command-here'") as info:
        missing()
    assert info.value.exit_code == 127


def test_a_program_that_kills_what_reports_it_fails_with_the_signal(tmp_path: Path) -> None:
    marker = tmp_path / "out" / "after"
    sly = program("sly", ["sh", "-c", f"kill -KILL $PPID; sleep 0.5; : > {marker}; exit 0"],
                  sandbox="bwrap", writable=[str(marker.parent)])
    with pytest.raises(ProgramError, match=r"before the program reported how it ended") \
            as info:
        sly()
    assert info.value.signal == "SIGKILL" and info.value.exit_code is None


def test_a_sandboxed_program_starts_with_the_signals_an_unsandboxed_one_has() -> None:
    """The reporter is Python, which ignores SIGPIPE and SIGXFSZ: the program must not."""
    show = ["grep", "^Sig\\(Ign\\|Blk\\)", "/proc/self/status"]
    plain = program("plain", show)()["stdout"]
    boxed = program("boxed", show, sandbox="bwrap")()["stdout"]
    # what this test process was started ignoring it passes on (a shell's background job
    # ignores SIGINT and SIGQUIT), but never what Python ignores for itself, nor the stop
    # signals: the program gets the default for those, so that a cancel can stop it
    own = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("SigIgn:")).split()[1], 16)
    pythons = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    stops = sum(1 << (s - 1) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    assert own & pythons == pythons     # (the reporter's Python ignores them too)
    assert boxed == plain and f"SigIgn:\t{own & ~(pythons | stops):016x}" in boxed, boxed


def test_a_symlink_a_program_left_in_its_writable_folder_leads_nothing_out(
        tmp_path: Path) -> None:
    """Attempt 1 replaces ``out/res`` (inside its writable ``out``) with a link to a folder
    outside; attempt 2 would have bound that folder read-write."""
    out = tmp_path / "out"
    (out / "res").mkdir(parents=True)
    # outside /tmp, which is private in the sandbox: seen there as on the host
    victim = Path(tempfile.mkdtemp(prefix="ledgerflow-victim-", dir="/var/tmp"))
    try:
        _plant_and_write(out, victim)
    finally:
        shutil.rmtree(victim)


def _plant_and_write(out: Path, victim: Path) -> None:
    link = os.path.relpath(victim, out)      # relative: bwrap follows it on the host
    plant = program("plant", ["sh", "-c", f"rm -r {out}/res && ln -s {link} {out}/res"],
                    sandbox="bwrap", writable=[str(out)])
    plant()
    assert (out / "res").is_symlink()
    write = program("write", ["sh", "-c", f"echo owned > {out}/res/x"], sandbox="bwrap",
                    writable=[str(out)], outputs=[f"{out}/res/x"])
    with pytest.raises(SandboxUnavailable, match="outside it"):
        write()
    peek = program("peek", ["cat", f"{out}/res/x"], sandbox="bwrap", view="declared",
                   writable=[str(out)], read_only=[f"{out}/res"])
    with pytest.raises(SandboxUnavailable, match="outside it"):
        peek()                                  # would show the victim folder read-only
    named = program("named", ["sh", "-c", 'echo owned > "$1"', "sh", f"{out}/{{name}}"],
                    sandbox="bwrap", outputs=[f"{out}/{{name}}"])
    with pytest.raises(UnsafeArgument, match="outside"):
        named(name="res/x")                     # through the link: out/res/x is victim/x
    assert list(victim.iterdir()) == []
