"""kill -9 under the commit lag: a crash repeats, unseen, at most the attempts started
within one lag, and every re-run the ledger could see is counted ``lost``.

A chain of plain inline tasks (each appends a line to a file, then sleeps 10 ms)
runs with a 50 ms lag, so at most four starts after a commit go ahead of the
next one; it is killed mid-run and resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_crash_recovery import _cli, _effects, _env, _kill, _start
from tests.waiting import wait_until

FLOW = '''
import os, time
from ledgerflow import pipeline, task

@task
def step(i: int, upstream: int | None) -> int:
    with open(os.environ["SIDE"], "a") as fh:
        fh.write(f"step[{i}]\\n")
    time.sleep(0.01)
    return i

@pipeline
def chain(n: int = 200):
    x = None
    for i in range(n):
        x = step(i, x)
    return x
'''

LAG, SLEEP = 0.05, 0.01


def _outcomes(run_id: str, ledger: str, key: str, env: dict[str, str]) -> list[str]:
    doc = json.loads(_cli(["status", run_id, "--store", ledger, "--task", key, "--json"],
                          env).stdout)
    return [a["outcome"] for a in doc["attempts"]]


@pytest.mark.parametrize("after", [20, 45, 70])
def test_a_kill_under_the_lag_repeats_at_most_one_lag_of_starts_unseen(
        tmp_path: Path, after: int) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    ledger = str(tmp_path / "ledger.duckdb")
    env = _env(tmp_path, LEDGERFLOW_COMMIT_LAG=str(LAG))
    proc, run_id = _start(["run", f"{flow}:chain", "--store", ledger, "--executor", "inline"],
                          env)
    wait_until(lambda: sum(_effects(tmp_path).values()) >= after, what=f"{after} steps")
    _kill(proc)
    res = _cli(["resume", run_id, "--store", ledger, "--executor", "inline"], env)
    assert res.returncode == 0, res.stderr
    effects = _effects(tmp_path)
    assert set(effects) == {f"step[{i}]" for i in range(200)}
    assert max(effects.values()) <= 2, effects.most_common(3)
    twice = sorted((int(k[5:-1]) for k, n in effects.items() if n == 2))
    seen = {i: _outcomes(run_id, ledger, "step" if i == 0 else f"step-{i + 1}", env)
            for i in twice}
    unseen = [i for i in twice if seen[i] == ["ok"]]
    lost = [i for i in twice if seen[i] == ["lost", "ok"]]
    assert sorted(unseen + lost) == twice, seen      # a re-run is unseen or lost, no other
    # starts at least SLEEP apart: one lag holds at most LAG / SLEEP of them
    assert len(unseen) <= LAG / SLEEP, unseen
    assert len(lost) <= 1, lost
    assert unseen == list(range(unseen[0], unseen[0] + len(unseen))) if unseen else True
    once = [k for k, n in effects.items() if n == 1][:5]
    for key in once:    # ran once: one ok attempt, nothing lost
        i = int(key[5:-1])
        assert _outcomes(run_id, ledger, "step" if i == 0 else f"step-{i + 1}", env) == ["ok"]
