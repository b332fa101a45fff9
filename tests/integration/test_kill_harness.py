"""The kill -9 harness: seeded SIGKILLs anywhere in real runs, resumed, checked (issues 31, 34).

Each case makes its share of ``LEDGERFLOW_KILL_POINTS`` kill points (default: a
bound for CI, about 90 s on a quiet 2-core machine) and prints its seed and counts
(``kill points: N, lost: 0, bricked: 0, stale: 0``) so that several CI runs add up;
``LEDGERFLOW_KILL_SEED`` replays one seed, ``LEDGERFLOW_KILL_LOG`` appends the counts
(and the first failures, with the trial folders to look at) as JSON lines to a file and
prints the cumulative counts of every run logged there, the figure to cite across CI
runs. Points are spread over a run: before the ledger exists, while it is made, mid-run
(after a random number of side effects) and in the final fold.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tests.integration.killing import (
    Project,
    Tally,
    journals,
    kill_points_wanted,
    last_commit_written,
    seeded,
    wait_for,
)

#: kill points of one CI run, shared out over the cases below by these weights
SHARES = {"effects": 5, "programs": 2, "approvals": 2, "damaged": 1, "concurrent": 2}
DEFAULT_POINTS = 24
#: no new trial once a case has run this long (``LEDGERFLOW_KILL_SECONDS``), so a loaded
#: machine makes fewer kill points (the counts say how many) instead of timing out
BUDGET = float(os.environ.get("LEDGERFLOW_KILL_SECONDS", "150"))

pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.timeout(BUDGET + 240)]


def _share(case: str) -> int:
    total = kill_points_wanted(DEFAULT_POINTS)
    return max(1, round(total * SHARES[case] / sum(SHARES.values())))


def _more(tally: Tally, case: str) -> bool:
    """Another trial: this case's kill points are not all made and its time is not up."""
    return tally.kills < _share(case) and time.monotonic() - tally.started < BUDGET


@pytest.fixture(scope="module")
def board(request: pytest.FixtureRequest) -> Iterator[list[tuple[str, Tally]]]:
    """Collects every case's tally; prints each case's seed and counts and the totals when
    the module ends."""
    cases: list[tuple[str, Tally]] = []
    yield cases
    tallies = [t for _, t in cases]
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    lines = [f"{name}: {t.line()}" for name, t in cases]
    lines.append(f"kill harness total: kill points: {sum(t.kills for t in tallies)}, "
                 f"lost: {sum(len(t.lost) for t in tallies)}, "
                 f"bricked: {sum(len(t.bricked) for t in tallies)}, "
                 f"stale: {sum(len(t.stale) for t in tallies)}")
    log = os.environ.get("LEDGERFLOW_KILL_LOG")
    if log and os.path.exists(log):
        lines.append(cumulative(Path(log)))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    # shown on the terminal even when every case passed (captured output is not)
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for line in lines:
            if reporter is not None:
                reporter.write_line(line)
            else:
                print(line)


@pytest.fixture
def tally(board: list[tuple[str, Tally]], request: pytest.FixtureRequest,
          tmp_path: Path) -> Iterator[Tally]:
    seed, _ = seeded()
    seed = (seed + sum(map(ord, request.node.name))) % (1 << 32)   # one stream per case
    own = Tally(seed)
    board.append((request.node.name, own))
    yield own
    log = os.environ.get("LEDGERFLOW_KILL_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"case": request.node.name, "seed": own.seed,
                                 "session": SESSION, "at": time.time(),
                                 "kill_points": own.kills, "lost": len(own.lost),
                                 "bricked": len(own.bricked), "stale": len(own.stale),
                                 "folder": str(tmp_path),
                                 "failures": (own.lost + own.bricked + own.stale)[:10]})
                     + "\n")


#: this harness run, as its lines in ``LEDGERFLOW_KILL_LOG`` name it
SESSION = f"{os.getpid()}-{int(time.time())}"


def cumulative(log: Path) -> str:
    """The counts of every harness run logged in ``log`` (one JSON line a case and run)."""
    rows = []
    for line in log.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue            # a line cut by a run that was stopped
    total = {k: sum(int(r.get(k, 0)) for r in rows)
             for k in ("kill_points", "lost", "bricked", "stale")}
    return (f"kill harness cumulative ({log}, {len(rows)} case result(s)): "
            f"kill points: {total['kill_points']}, lost: {total['lost']}, "
            f"bricked: {total['bricked']}, stale: {total['stale']}")


def _verdict(tally: Tally) -> None:
    print(tally.line())
    assert not (tally.lost or tally.bricked or tally.stale), tally.failures()
    assert tally.kills > 0, "no kill point was made"


def _kill_somewhere(p: Project, proc, rng: random.Random, side_effects: int,
                    where: str | None = None) -> str:
    """Wait for a chosen point of ``proc``'s run, then SIGKILL it; say which point."""
    where = where or rng.choice(["start", "creation", "mid", "mid", "final-fold"])
    if where == "start":                        # before the ledger (or its journal) exists
        time.sleep(rng.uniform(0.0, 0.6))
    elif where == "creation":                   # while the ledger file is being made
        wait_for(lambda: Path(p.ledger).exists() or journals(p.ledger), 60)
        time.sleep(rng.uniform(0.0, 0.15))
    elif where == "mid":
        wanted = rng.randint(1, max(1, side_effects - 1))
        wait_for(lambda: sum(p.effects().values()) >= wanted, 60)
    else:
        wait_for(lambda: last_commit_written(p.ledger), 60)
    p.kill(proc)
    return where


def _new_run(p: Project, rng: random.Random, *args: str, side_effects: int) -> str | None:
    """Start ``pipeline run`` and kill it at a random point; the run's id, if one was made."""
    proc = p.start("run", *args)
    _kill_somewhere(p, proc, rng, side_effects)
    ids = p.run_ids()
    return ids[0] if ids else None


def _maybe_kill_a_resume(p: Project, rng: random.Random, run_id: str, *args: str) -> None:
    """Half the time, kill the first ``resume`` too, somewhere in its run."""
    if rng.random() < 0.5:
        proc = p.start("resume", run_id, *args)
        time.sleep(rng.uniform(0.2, 2.0))
        p.kill(proc)


def _executor(rng: random.Random) -> tuple[str, ...]:
    return rng.choice([("--executor", "inline"), ("--executor", "threads", "--workers", "2")])


def _fold_env(rng: random.Random) -> dict[str, str]:
    """Folds often (the file made early, kills land in folds) or only at the end."""
    return rng.choice([{"LEDGERFLOW_FOLD_INTERVAL": "0.1", "LEDGERFLOW_FOLD_WAKE_BYTES": "1"},
                       {}, {"LEDGERFLOW_FOLD_INTERVAL": "3600"}])


def _kill_resume_trials(tmp_path: Path, tally: Tally, case: str, pipeline: str,
                        params: tuple[str, ...], side_effects: int, **env: str) -> None:
    """Trials of one case: a run killed at a random point (and maybe its first resume),
    then resumed to the end; every invariant checked by :class:`Project`."""
    rng = random.Random(tally.seed)
    trial = 0
    while _more(tally, case):
        trial += 1
        p = Project(tmp_path / f"t{trial}", tally, **env, **_fold_env(rng))
        ex = _executor(rng)
        run_id = _new_run(p, rng, f"{p.flow}:{pipeline}", *params, *ex,
                          side_effects=side_effects)
        if run_id is None:                      # killed before the run was recorded
            assert p.cli("runs").returncode == 0
            continue
        _maybe_kill_a_resume(p, rng, run_id, *ex)
        after = p.finish(run_id, resume=ex)
        if after is not None and after["state"] != "succeeded":
            tally.bricked.append(f"t{trial} {run_id}: resume left it {after['state']}")
    _verdict(tally)


def test_side_effect_tasks_killed_anywhere(tmp_path: Path, tally: Tally) -> None:
    _kill_resume_trials(tmp_path, tally, "effects", "fan", ("-p", "n=30"), 30, DELAY="0.03")


def test_program_tasks_killed_anywhere(tmp_path: Path, tally: Tally) -> None:
    _kill_resume_trials(tmp_path, tally, "programs", "progs", ("-p", "n=8", "-p", "delay=0.15"),
                        8)


def test_approval_waits_killed_then_approved_and_resumed(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(tally.seed)
    trial = 0
    while _more(tally, "approvals"):
        trial += 1
        p = Project(tmp_path / f"t{trial}", tally, DELAY="0.03", **_fold_env(rng))
        run_id = _new_run(p, rng, f"{p.flow}:gated", "--executor", "inline", side_effects=20)
        if run_id is None:
            continue
        waiting = p.finish(run_id, resume=("--executor", "inline"), expect=3)   # at the gate
        if waiting is None:
            continue
        res = p.cli("approvals", run_id, "--json")
        requests = json.loads(res.stdout) if res.returncode == 0 else []
        if len(requests) != 1:
            tally.bricked.append(f"t{trial} {run_id}: waiting requests {requests}")
            continue
        approved = p.cli("approve", run_id, "publish", "--digest", requests[0]["digest"][:12])
        if approved.returncode != 0:
            tally.bricked.append(f"t{trial} {run_id}: approve: {approved.stderr.strip()}")
            continue
        _maybe_kill_a_resume(p, rng, run_id, "--executor", "inline")
        done = p.finish(run_id, resume=("--executor", "inline"))
        if done is None:
            continue
        if done["state"] != "succeeded":
            tally.bricked.append(f"t{trial} {run_id}: resume left it {done['state']}")
        effects = p.effects()           # (repeats beyond lost attempts: checked in finish)
        if not (effects["publish"] and effects["after"]):
            tally.lost.append(f"t{trial} {run_id}: publish ran {effects['publish']}, "
                              f"after ran {effects['after']} times")
    _verdict(tally)


def _damage_a_line(journal: Path, rng: random.Random) -> None:
    """Replace one line in the middle of a live journal with garbage."""
    lines = journal.read_bytes().splitlines(keepends=True)
    if len(lines) < 3:
        journal.write_bytes(journal.read_bytes() + b"this is not a journal line\n")
        return
    lines[rng.randint(1, len(lines) - 2)] = b"this is not a journal line\n"
    journal.write_bytes(b"".join(lines))


def test_a_damaged_journal_line_beside_healthy_runs(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(tally.seed)
    trial = 0
    while _more(tally, "damaged"):
        trial += 1
        p = Project(tmp_path / f"t{trial}", tally, DELAY="0.05", LEDGERFLOW_FOLD_INTERVAL="3600")
        healthy = p.cli("run", f"{p.flow}:progs", "-p", "n=3", "-p", "delay=0", "--json")
        healthy_id = json.loads(healthy.stdout)["run_id"]
        proc = p.start("run", f"{p.flow}:fan", "-p", "n=30", *_executor(rng))
        wanted = 3 + rng.randint(1, 25)
        wait_for(lambda p=p, wanted=wanted: sum(p.effects().values()) >= wanted, 60)
        p.kill(proc)
        live = journals(p.ledger)
        if not live:
            continue
        _damage_a_line(live[0], rng)
        run_id = live[0].name.split(".")[0]
        after = p.finish(run_id, resume=("--executor", "inline"), repeats=False)
        if after is not None and after["state"] != "succeeded":
            tally.bricked.append(f"t{trial} {run_id}: resume left it {after['state']}")
        view = p.status(healthy_id)
        if view is not None:
            if view["state"] != "succeeded" or len(view["tasks"]) != 4:
                tally.lost.append(f"t{trial}: the healthy run {healthy_id} became "
                                  f"{view['state']} with {len(view['tasks'])} tasks")
            p.check_sql(healthy_id, view)
    _verdict(tally)


def test_two_concurrent_resumes_of_a_dead_run_one_wins(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(tally.seed)
    trial = 0
    while _more(tally, "concurrent"):
        trial += 1
        p = Project(tmp_path / f"t{trial}", tally, DELAY="0.05", **_fold_env(rng))
        proc = p.start("run", f"{p.flow}:fan", "-p", "n=40", "--executor", "inline")
        _kill_somewhere(p, proc, rng, 40, where="mid")
        ids = p.run_ids()
        if len(ids) != 1:                       # (runs refused: counted as bricked)
            continue
        run_id = ids[0]
        first = p.status(run_id)
        if first is None or first["state"] == "succeeded":     # it ended before the kill
            continue
        before, ran_before = {t["key"]: t["attempts"] for t in first["tasks"]
                              if t["state"] == "succeeded"}, p.effects()
        both = [p.start("resume", run_id, "--executor", "inline") for _ in range(2)]
        codes = sorted(r.wait(timeout=180) for r in both)
        texts = [p.output(r) for r in both]
        if codes != [0, 2]:
            tally.bricked.append(f"t{trial} {run_id}: two resumes ended {codes}: "
                                 + " | ".join(t.strip()[-200:] for t in texts))
        elif not any("Error:" in t for t in texts):
            tally.bricked.append(f"t{trial} {run_id}: the refused resume said nothing")
        after = p.status(run_id)
        if after is None:
            continue
        if after["state"] != "succeeded":
            tally.bricked.append(f"t{trial} {run_id}: after two resumes it is {after['state']}")
            continue
        p.check_kept(run_id, before, ran_before, after)
        p.check_sql(run_id, after)
        p.check_repeats(run_id)
    _verdict(tally)


def test_the_checks_catch_a_stale_table_a_repeated_effect_and_a_refused_command(
        tmp_path: Path) -> None:
    """The harness can fail: each invariant check sees its own kind of breakage."""
    p = Project(tmp_path, Tally(0), DELAY="0")
    done = p.cli("run", f"{p.flow}:fan", "-p", "n=3", "--executor", "inline", "--json")
    run_id = json.loads(done.stdout)["run_id"]
    view = p.status(run_id)
    assert view is not None and view["state"] == "succeeded"
    p.check_sql(run_id, view)
    p.check_repeats(run_id)
    assert not (p.tally.lost or p.tally.bricked or p.tally.stale), p.tally.failures()
    with open(p.env["SIDE"], "a") as fh:            # effect[1] ran again, nothing lost
        fh.write("effect[1]\n")
    p.check_repeats(run_id)
    assert len(p.tally.lost) == 1 and "effect[1] ran 2 times" in p.tally.lost[0]
    con = duckdb.connect(p.ledger)
    con.execute("UPDATE tasks SET state = 'running' WHERE task_key = 'effect[2]'")
    con.close()
    p.check_sql(run_id, view)
    assert len(p.tally.stale) == 1 and "effect[2]" in p.tally.stale[0]
    p.cli("status", "no-such-run")
    p.cli("resume", run_id)                         # exit 2 with a message: not bricked
    assert not p.tally.bricked, p.tally.bricked
