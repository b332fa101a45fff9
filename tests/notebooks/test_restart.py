"""Notebook-style pipelines (defined in ``__main__``) resumed across interpreters.

A first interpreter starts a run with ``wait=False`` and is killed with
SIGKILL mid-run; a second one re-defines the same pipeline, as re-running a
notebook cell would, and resumes the run by id. Side-effect files show that
tasks which had succeeded were not executed again.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from ledgerflow.keys import code_version

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")

# The "notebook cell": executed with exec() in __main__, so no source file exists.
CELL = textwrap.dedent("""
    import os, time
    from ledgerflow import task, pipeline

    LOG = os.environ["LF_TEST_LOG"]

    @task
    def fetch(i: int) -> int:
        time.sleep(0.15)
        with open(LOG, "a") as f:
            f.write(f"fetch[{i}] {os.getpid()}\\n")
        return i * 10

    @task
    def combine(values: list[int]) -> int:
        with open(LOG, "a") as f:
            f.write(f"combine {os.getpid()}\\n")
        return sum(values)

    @pipeline
    def slow_sum(n: int = 16):
        return combine(fetch.map(list(range(n))))
""")

START = CELL + textwrap.dedent("""
    run = slow_sum.run(store=os.environ["LF_TEST_STORE"], workers=2, wait=False)
    print(run.run_id, flush=True)
    run.wait()
    print("FINISHED", flush=True)
""")

RESUME = CELL + textwrap.dedent("""
    import json
    import ledgerflow
    store = os.environ["LF_TEST_STORE"]
    run_id = os.environ["LF_TEST_RUN_ID"]
    before = ledgerflow.get_run(run_id, store=store).status()
    done = sorted(k for k, t in before.tasks.items() if t.state == "succeeded")
    run = ledgerflow.resume(run_id, store=store, workers=2)
    outcomes = sorted({a["outcome"] for a in run.attempts()})
    print(json.dumps({"before_state": before.state, "done_before": done, "state": run.state,
                      "result": run.result(), "outcomes": outcomes, "pid": os.getpid()}))
""")


def _python(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Run ``code`` as a notebook kernel would: compiled from a string in ``__main__``."""
    launcher = "import sys; exec(compile(sys.argv[1], '<cell>', 'exec'))"
    return subprocess.Popen([sys.executable, "-c", launcher, code], env=env, text=True,
                            stdout=subprocess.PIPE)


def _log(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(k, int(p)) for k, p in (ln.split() for ln in path.read_text().splitlines())]


@pytest.mark.slow
def test_resume_after_sigkill_in_a_fresh_interpreter(tmp_path: Path) -> None:
    log = tmp_path / "executions.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(LF_TEST_LOG=str(log), LF_TEST_STORE=str(tmp_path / "ledger.duckdb"))
    first = _python(START, env)
    try:
        assert first.stdout is not None
        run_id = first.stdout.readline().strip()
        assert run_id, "the first interpreter printed no run id"
        deadline = time.monotonic() + 30
        while len(_log(log)) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)        # let the driver commit a few successes
    finally:
        first.send_signal(signal.SIGKILL)
        rest, _ = first.communicate(timeout=30)
    assert "FINISHED" not in rest, "the run ended before it could be killed"
    first_pid = first.pid
    killed_at = _log(log)
    assert 5 <= len(killed_at) < 17

    second = _python(RESUME, {**env, "LF_TEST_RUN_ID": run_id})
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    report = json.loads(out.strip().splitlines()[-1])

    assert report["state"] == "succeeded"
    assert report["result"] == sum(i * 10 for i in range(16))
    assert report["before_state"] == "running"            # the driver died, nothing ended it
    assert "lost" in report["outcomes"]                   # attempts running at the kill
    done_before = report["done_before"]
    assert done_before, "no success was committed before the kill"

    runs: dict[str, list[int]] = {}
    for key, pid in _log(log):
        runs.setdefault(key, []).append(pid)
    assert sorted(runs) == sorted([*(f"fetch[{i}]" for i in range(16)), "combine"])
    for key in done_before:                               # committed: never executed again
        assert runs[key] == [first_pid], (key, runs[key])
    for key, pids in runs.items():                        # at most once per interpreter
        assert len(pids) == len(set(pids)) and set(pids) <= {first_pid, report["pid"]}, key
    # tasks the first driver had not finished ran in the second interpreter
    assert any(report["pid"] in pids for pids in runs.values())


def _exec_in_fake_main(src: str, filename: str = "<cell>") -> types.ModuleType:
    module = types.ModuleType("__main__")
    exec(compile(src, filename, "exec"), module.__dict__)
    return module


BODY = """
def clean(text):
    words = [w.strip(".,") for w in text.split()]
    return " ".join(w.lower() for w in words if w)
"""


def test_code_version_without_source_is_stable_and_tracks_the_body() -> None:
    a = _exec_in_fake_main(BODY, "<cell-1>")
    b = _exec_in_fake_main("\n\n# moved down and re-run\n" + BODY, "<cell-7>")
    changed = _exec_in_fake_main(BODY.replace("w.lower()", "w.upper()"), "<cell-8>")
    with pytest.raises(OSError):                 # really no source: the fallback is used
        inspect.getsource(a.clean)
    assert code_version(a.clean) == code_version(b.clean)
    assert code_version(a.clean) != code_version(changed.clean)
    renamed = _exec_in_fake_main(BODY.replace("words", "tokens"), "<cell-9>")
    assert code_version(a.clean) != code_version(renamed.clean)


def _versions_across_interpreters(body: str, name: str, seeds: tuple[str, ...]) -> set[str]:
    """The code version of ``name`` defined by ``body`` in a fresh interpreter per hash seed."""
    code = ("import types; from ledgerflow.keys import code_version\n"
            "m = types.ModuleType('__main__')\n"
            f"exec(compile({body!r}, '<cell>', 'exec'), m.__dict__)\n"
            f"print(code_version(m.{name}))")
    return {subprocess.run([sys.executable, "-c", code], text=True, check=True,
                           capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}
                           ).stdout.strip() for seed in seeds}


def test_code_version_without_source_is_stable_across_interpreters() -> None:
    assert len(_versions_across_interpreters(BODY, "clean", ("1", "2"))) == 1


SET_BODY = """
def keep(word):
    return word in {"alpha", "beta", "gamma", "delta", "epsilon"}
"""


def test_code_version_of_set_literals_is_stable_across_interpreters() -> None:
    assert len(_versions_across_interpreters(SET_BODY, "keep", ("1", "2", "3", "4"))) == 1
