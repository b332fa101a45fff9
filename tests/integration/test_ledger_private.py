"""What ledgerflow creates of a ledger is private to its user, whatever the umask.

A fresh ledger (its folder, the DuckDB file, journals, decision files, step logs,
result files, leases) is created 0700 for folders and 0600 for files; a ledger
that exists keeps the modes it has (a team may share one with its group).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

FLOW = '''
import os
from ledgerflow import context, pipeline, task

@task
def build(n: int) -> str:
    context().step("fetch", lambda: n)
    print("building", n)
    if not os.path.exists(os.environ["FIXED"]):
        raise RuntimeError("not yet")
    return "x" * (n * 1000)          # a result file, not inline

@task(approve=True)
def publish(text: str) -> int:
    return len(text)

@pipeline
def gated(n: int = 5):
    return publish(build(n))
'''


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # as a user whose umask lets the group and others read what they create
    return subprocess.run(["sh", "-c", 'umask 022 && exec "$0" "$@"', sys.executable, "-m",
                           "ledgerflow", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _life(tmp: Path, ledger: str, n: int = 5) -> str:
    """A run that fails, is resumed to its gate, approved and resumed to its end."""
    (tmp / "flow.py").write_text(FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["FIXED"] = str(tmp / "fixed")
    first = _cli("run", str(tmp / "flow.py"), "--store", ledger, "-p", f"n={n}", env=env)
    assert first.returncode == 1, first.stdout + first.stderr
    run_id = first.stdout.split()[1]
    (tmp / "fixed").write_text("")
    gate = _cli("resume", run_id, "--store", ledger, env=env)
    assert gate.returncode == 3, gate.stdout + gate.stderr
    (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                             env=env).stdout)
    assert _cli("approve", run_id, "publish", "--digest", req["digest"][:12], "--store",
                ledger, env=env).returncode == 0
    end = _cli("resume", run_id, "--store", ledger, env=env)
    assert end.returncode == 0, end.stdout + end.stderr
    return run_id


def _open_to_others(top: Path) -> list[str]:
    found = []
    for path in [top, *top.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{oct(mode)} {path.relative_to(top.parent)}")
    return found


def test_a_fresh_ledger_has_no_file_or_folder_others_can_read(tmp_path: Path) -> None:
    top = tmp_path / "private"          # the ledger's folder too is created by ledgerflow
    ledger = str(top / "ledger.duckdb")
    run_id = _life(tmp_path, ledger)
    side = Path(ledger + ".d")
    kinds = {p.relative_to(side).parts[0] for p in side.rglob("*") if p.is_file()}
    assert {"journals", "results", "runs"} <= kinds, kinds
    assert list((side / "runs" / run_id / "decisions").glob("*.json"))
    assert list((side / "runs" / run_id / "steps").glob("*.jsonl"))
    assert len(list((side / "journals").glob(f"{run_id}.*"))) == 3
    assert _open_to_others(top) == []


def test_an_existing_ledger_keeps_the_modes_it_has(tmp_path: Path) -> None:
    top = tmp_path / "shared"
    ledger = str(top / "ledger.duckdb")
    _life(tmp_path, ledger)
    shared = [top, Path(ledger), Path(ledger + ".d"), Path(ledger + ".d") / "journals"]
    for p in shared:
        p.chmod(0o750 if p.is_dir() else 0o640)
    (tmp_path / "fixed").unlink()
    _life(tmp_path, ledger, n=6)
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in shared] == \
        ["0o750", "0o640", "0o750", "0o750"]
