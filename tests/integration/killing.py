"""The kill -9 harness's toolkit: seeded kill points, a trial's project, and its invariant checks.

A trial starts ``pipeline`` commands in real subprocesses, SIGKILLs them at chosen
points and checks three invariants, counted in a :class:`Tally`:

* lost: a committed success is kept (same attempts, its side effect never repeated),
  and a task whose side effect ran twice shows the extra attempts as ``lost``;
* bricked: every command exits 0/1/2/3 (a non-zero one with a message, never 70),
  and a ``resume`` finishes the run;
* stale: once a driver exits normally, the SQL tables (read with plain ``duckdb``)
  agree with ``pipeline status --json`` (run state, every task's state and attempts).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from tests.integration.test_crash_recovery import _effects, _env, _succeeded

FLOW = '''
import os, time
from ledgerflow import Approval, pipeline, program, task

SIDE = os.environ["SIDE"]

def mark(what):
    with open(SIDE, "a") as fh:            # the side effect a re-run would repeat
        fh.write(what + "\\n")

@task
def items(n: int) -> list[int]:
    return list(range(n))

@task(side_effects=True)      # its start is committed before it runs: no commit lag
def effect(i: int) -> int:
    mark(f"effect[{i}]")
    time.sleep(float(os.environ.get("DELAY", "0.02")))
    return i

@task
def total(xs: list[int]) -> int:
    return sum(xs)

@task
def numbers(n: int, start: int) -> list[int]:
    return list(range(start, start + n))

@pipeline
def fan(n: int = 40, start: int = 0):
    return total(effect.map(numbers(n, start) if start else items(n)))

prog = program("prog", ["sh", "-c", 'echo "prog[$1]" >> "$SIDE"; sleep "$2"', "sh", "{i}",
                        "{delay}"])

@task
def count(rs: list) -> int:
    return len(rs)

@pipeline
def progs(n: int = 8, delay: str = "0.1"):
    return count([prog(i=i, delay=delay) for i in range(n)])

@task(approve=Approval(timeout=3600))
def publish(x: int) -> int:
    mark("publish")
    return x

@task(side_effects=True)
def after(x: int) -> int:
    mark("after")
    return x + 1

@pipeline
def gated(n: int = 20):
    return after(publish(total(effect.map(items(n)))))
'''

#: exit codes a command may end with; 70 (an internal error) counts as bricked
FINE_CODES = frozenset({0, 1, 2, 3})


def kill_points_wanted(default: int) -> int:
    """The kill points of this CI run: ``LEDGERFLOW_KILL_POINTS``, else ``default``."""
    return max(1, int(os.environ.get("LEDGERFLOW_KILL_POINTS", default)))


def seeded() -> tuple[int, random.Random]:
    """The run's seed (``LEDGERFLOW_KILL_SEED`` to replay one) and its random source."""
    seed = int(os.environ.get("LEDGERFLOW_KILL_SEED", random.SystemRandom().randrange(1 << 32)))
    return seed, random.Random(seed)


@dataclass
class Tally:
    """What a harness run counted: kill points made and each invariant's failures."""

    seed: int
    kills: int = 0
    started: float = field(default_factory=time.monotonic)
    lost: list[str] = field(default_factory=list)
    bricked: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"seed {self.seed}: kill points: {self.kills}, lost: {len(self.lost)}, "
                f"bricked: {len(self.bricked)}, stale: {len(self.stale)}")

    def failures(self) -> str:
        out = [self.line()]
        for name in ("lost", "bricked", "stale"):
            out += [f"  {name}: {what}" for what in getattr(self, name)[:10]]
        return "\n".join(out)


class Project:
    """One trial's folder: the flow file, a ledger, the side-effect log and the commands."""

    def __init__(self, root: Path, tally: Tally, **env: str) -> None:
        self.root, self.tally = root, tally
        root.mkdir(parents=True, exist_ok=True)
        self.flow = root / "flow.py"
        self.flow.write_text(FLOW)
        self.ledger = str(root / "ledger.duckdb")
        self.env = _env(root, **env)
        self.outputs: dict[int, Path] = {}

    # -- commands ----------------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run one command to its end; an exit outside 0-3, or silent failure, is bricked."""
        res = subprocess.run([sys.executable, "-m", "ledgerflow", *args, "--store", self.ledger],
                             capture_output=True, text=True, env=self.env, timeout=timeout)
        said = (res.stdout + res.stderr).strip()
        if res.returncode not in FINE_CODES or (res.returncode == 2 and not said):
            self.tally.bricked.append(f"{self.root.name}: {args[0]} exit {res.returncode}: "
                                      f"{res.stderr.strip()[-300:]}")
        return res

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start a command without waiting; its output goes to the file ``output(proc)`` reads."""
        path = self.root / f"out-{time.monotonic_ns()}.txt"
        with open(path, "w") as out:            # the child keeps its own copy of the file
            proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", *args, "--store",
                                     self.ledger], stdout=out, stderr=subprocess.STDOUT,
                                    text=True, env=self.env)
        self.outputs[proc.pid] = path
        return proc

    def output(self, proc: subprocess.Popen[str]) -> str:
        """What a started command wrote (stdout and stderr)."""
        return self.outputs[proc.pid].read_text()

    def kill(self, proc: subprocess.Popen[str]) -> bool:
        """SIGKILL ``proc`` (a kill point if it was still alive); True if it was."""
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGKILL)
            self.tally.kills += 1
        proc.wait(timeout=60)
        return alive

    def run_ids(self) -> list[str]:
        res = self.cli("runs", "--json")
        return [r["run_id"] for r in json.loads(res.stdout)] if res.returncode == 0 else []

    def status(self, run_id: str) -> dict | None:
        res = self.cli("status", run_id, "--json")
        if res.returncode not in (0, 1):
            if res.returncode in (2, 3):               # (70 and the like: counted by cli)
                self.tally.bricked.append(f"{self.root.name}: status exit {res.returncode}: "
                                          f"{res.stderr.strip()[-300:]}")
            return None
        return json.loads(res.stdout)

    def effects(self) -> Counter[str]:
        return _effects(self.root)

    # -- invariants --------------------------------------------------------------------------
    def sql(self) -> tuple[dict, dict, dict]:
        """Run states, task states (with attempts) and attempt outcomes, read with duckdb."""
        con = duckdb.connect(self.ledger, read_only=True)
        try:
            runs = dict(con.execute("SELECT run_id, state FROM runs").fetchall())
            tasks: dict[str, dict[str, tuple[str, int]]] = {}
            for run_id, key, state, attempts in con.execute(
                    "SELECT run_id, task_key, state, attempts FROM tasks").fetchall():
                tasks.setdefault(run_id, {})[key] = (state, attempts)
            outcomes: dict[tuple[str, str], list[str]] = {}
            for run_id, key, outcome in con.execute(
                    "SELECT run_id, task_key, outcome FROM attempts ORDER BY attempt").fetchall():
                outcomes.setdefault((run_id, key), []).append(outcome)
        finally:
            con.close()
        return runs, tasks, outcomes

    def check_sql(self, run_id: str, view: dict) -> None:
        """The tables agree with ``status --json`` (call after a driver exited normally)."""
        try:
            runs, tasks, _ = self.sql()
        except duckdb.Error as exc:
            self.tally.stale.append(f"{self.root.name} {run_id}: tables unreadable: {exc}")
            return
        told = {t["key"]: (t["state"], t["attempts"]) for t in view["tasks"]}
        if runs.get(run_id) != view["state"] or tasks.get(run_id, {}) != told:
            wrong = sorted(k for k in told.keys() | tasks.get(run_id, {}).keys()
                           if told.get(k) != tasks.get(run_id, {}).get(k))
            self.tally.stale.append(f"{self.root.name} {run_id}: SQL run {runs.get(run_id)!r} vs "
                                    f"status {view['state']!r}; tasks differ: {wrong[:5]}")

    def check_kept(self, run_id: str, before: dict[str, int], ran_before: Counter[str],
                   after: dict) -> None:
        """Committed successes ``before`` a kill are kept, their effects never repeated."""
        kept = _succeeded(after)
        again = self.effects() - ran_before
        for key, attempts in before.items():
            if kept.get(key) != attempts:
                self.tally.lost.append(f"{self.root.name} {run_id}: {key} had {attempts} "
                                       f"attempt(s), succeeded; now {kept.get(key)}")
            elif again[key]:
                self.tally.lost.append(f"{self.root.name} {run_id}: committed {key} ran again")

    def check_repeats(self, run_id: str) -> None:
        """A side effect that ran n times has n - 1 attempts shown as ``lost``."""
        try:
            _, tasks, outcomes = self.sql()
        except duckdb.Error:                        # (check_sql counted it as stale)
            return
        for mark, n in self.effects().items():
            key = task_key(mark)
            if key not in tasks.get(run_id, {}):          # another run's side effect
                continue
            lost = outcomes.get((run_id, key), []).count("lost")
            if n > 1 + lost:
                self.tally.lost.append(f"{self.root.name} {run_id}: {key} ran {n} times, "
                                       f"{lost} attempt(s) lost: {outcomes.get((run_id, key))}")

    def finish(self, run_id: str, *, resume: tuple[str, ...] = (), expect: int = 0,
               repeats: bool = True) -> dict | None:
        """Resume a killed run to its end and check all three invariants (``repeats=False``:
        past a damaged journal line, successes the journal lost may run again)."""
        first = self.status(run_id)
        if first is None:
            return None
        before, ran_before = _succeeded(first), self.effects()
        if first["state"] != "succeeded" or first["driver_alive"]:
            res = self.cli("resume", run_id, *resume)
            if res.returncode != expect:
                self.tally.bricked.append(f"{self.root.name} {run_id}: resume exit "
                                          f"{res.returncode} (wanted {expect}): "
                                          f"{(res.stdout + res.stderr).strip()[-300:]}")
                return None
        else:                                       # finished before the kill: fold it
            fold = self.cli("fold")
            if fold.returncode != 0:
                self.tally.stale.append(f"{self.root.name} {run_id}: fold exit "
                                        f"{fold.returncode}: {(fold.stdout + fold.stderr)[-300:]}")
                return None
        after = self.status(run_id)
        if after is None:
            return None
        self.check_kept(run_id, before, ran_before, after)
        self.check_sql(run_id, after)
        if repeats:
            self.check_repeats(run_id)
        return after


def task_key(mark: str) -> str:
    """The task a side-effect mark belongs to: ``effect[3]`` is itself; the program's
    ``prog[i]`` is its i-th call in the pipeline, keyed ``prog``, ``prog-2``, ..."""
    if mark.startswith("prog["):
        i = int(mark[5:-1])
        return "prog" if i == 0 else f"prog-{i + 1}"
    return mark


def wait_for(probe: Callable[[], object], timeout: float) -> bool:
    """Poll ``probe`` until it is truthy or ``timeout`` passes; False if it never was."""
    end = time.monotonic() + timeout
    while not probe():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


def journals(ledger: str) -> list[Path]:
    """The live journals beside a ledger."""
    return sorted((Path(ledger + ".d") / "journals").glob("*.jsonl"))


#: How a drive's last commit ends: the run's state when its driver stops (a run at an
#: approval gate stops ``waiting``).
_LAST_STATES = (b'["S","succeeded"', b'["S","failed"', b'["S","cancelled"', b'["S","waiting"')


def last_commit_written(ledger: str) -> bool:
    """A live journal ends with the state the run's driver stops in: it is in the final
    fold."""
    for journal in journals(ledger):
        try:
            with open(journal, "rb") as fh:
                fh.seek(max(0, journal.stat().st_size - 400))
                tail = fh.read()
                if any(state in tail for state in _LAST_STATES):
                    return True
        except FileNotFoundError:
            continue
    return False
