"""A worker takes over a killed worker's run on the same host at once, not at lease
expiry (issue 34 #6): the dead holder's pid is gone (``ledgerflow.procs``)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until

from .test_postgres_crash import CLI, FLOW, effects, env_for, q, status

TTL = "120"       # far longer than the takeover may take


def _worker(url: str, tmp_path: Path, name: str, side: Path) -> subprocess.Popen[str]:
    with open(tmp_path / f"{name}.log", "w") as log:     # the child keeps its own copy
        return subprocess.Popen([*CLI, "worker", "--store", url, "--poll", "0.2",
                                 "--exit-idle", "20", "--workers", "2"],
                                stdout=log, stderr=subprocess.STDOUT, text=True,
                                env=env_for(tmp_path, SIDE_EFFECTS=str(side), STEP="0.3",
                                            LEDGERFLOW_LEASE_TTL=TTL))


@pytest.mark.timeout(300)
def test_a_killed_workers_run_is_taken_over_at_once_on_the_same_host(
        pg_url: str, tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    side = tmp_path / "effects.txt"
    env = env_for(tmp_path)
    run_id = subprocess.run([sys.executable, "-c", "import sys; from ledgerflow.control "
                             "import submit; print(submit(sys.argv[1], params={'n': 12, "
                             "'tag': 'long'}, store=sys.argv[2]))", str(flow), pg_url],
                            env=env, capture_output=True, text=True, timeout=60, check=True
                            ).stdout.strip()
    victim = _worker(pg_url, tmp_path, "victim", side)
    survivor: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: any(w == "done" for w, _, _ in effects(side, run_id)), timeout=90,
                   what="the victim's first task to finish")
        assert status(pg_url, run_id).driver_pid == victim.pid
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        survivor = _worker(pg_url, tmp_path, "survivor", side)
        # (a survivor that waited for the lease would exit idle first: this wait fails)
        wait_until(lambda: q(pg_url, "SELECT token FROM runs WHERE run_id = %s",
                             [run_id]) == [(3,)], timeout=120,
                   what=lambda: ("the survivor's takeover",
                                 (tmp_path / "survivor.log").read_text()))
        # taken over because its driver died, while the victim's lease still held (the
        # claim says which): not at the lease's expiry
        out = (tmp_path / "survivor.log").read_text()
        assert (f"run {run_id} claimed (token 3): its driver (pid {victim.pid} on this "
                "host) is gone") in out, out
        wait_until(lambda: q(pg_url, "SELECT state FROM runs WHERE run_id = %s",
                             [run_id]) == [("succeeded",)], timeout=120,
                   what="the survivor to finish the run")
        assert status(pg_url, run_id).driver_pid == survivor.pid
        done = [k for w, k, _ in effects(side, run_id) if w == "done"]
        assert sorted(set(done)) == sorted(f"work[{i}]" for i in range(12))
    finally:
        for p in (victim, survivor):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
