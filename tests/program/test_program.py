"""Program tasks through the real runner: process trees stopped, output kept, no shell."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import DefinitionError, Limits, pipeline, program
from ledgerflow.programs import ProgramError
from tests.program.proctools import PY, alive, kill_all, roles
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TREE = ("main", "child", "setsid-grandchild")


def _ended_after(attempt: dict, t: float) -> float:
    return float(attempt["ended_at"]) - t


NAP = program("nap", ["sleep", "0.1"])


def _with(executor: str, ref: object) -> object:
    """``threads-pool``: a second task makes the runner use the pool (a lone task on
    ``threads`` runs in the driver thread)."""
    return (ref, NAP()) if executor.endswith("-pool") else ref


@pytest.mark.parametrize("executor", ["inline", "threads", "threads-pool", "processes"])
def test_a_timeout_stops_the_whole_tree_before_the_attempt_ends(
        helpers: Path, tmp_path: Path, ledger: str, executor: str) -> None:
    pids_file = tmp_path / "pids"
    stubborn = program("stubborn", [PY, str(helpers / "stubborn.py"), "{out}"],
                       timeout=1, grace=1)

    @pipeline
    def p(out: str):
        return _with(executor, stubborn(out=out))

    try:
        run = p.run(str(pids_file), store=ledger, executor=executor.removesuffix("-pool"))
        tree = roles(pids_file)
        assert set(tree) == set(TREE)            # TERM ignored by all, one left the group
        assert not [r for r, pid in tree.items() if alive(pid)]   # gone when it ended
        assert run.status().tasks["stubborn"].state == "failed"
        [attempt] = run.attempts("stubborn")
        assert attempt["outcome"] == "timeout"
        # TERM at 1 s, KILL at 2 s: gone within 3 s of the timeout
        assert _ended_after(attempt, float(attempt["started_at"])) < 1 + 3
        assert "process tree was stopped" in (run.status().tasks["stubborn"].error or "")
    finally:
        kill_all(roles(pids_file))


@pytest.mark.parametrize("executor", ["threads", "threads-pool", "processes"])
def test_a_cancel_stops_the_whole_tree_before_the_attempt_ends(
        helpers: Path, tmp_path: Path, ledger: str, executor: str) -> None:
    pids_file = tmp_path / "pids"
    stubborn = program("stubborn", [PY, str(helpers / "stubborn.py"), "{out}"], grace=1)

    @pipeline
    def p(out: str):
        return _with(executor, stubborn(out=out))

    try:
        run = p.run(str(pids_file), store=ledger, executor=executor.removesuffix("-pool"),
                    wait=False)
        wait_until(lambda: len(roles(pids_file)) == 3, what="the whole tree to start")
        asked = time.time()
        run.cancel()
        assert run.wait(timeout=30) == "cancelled"
        tree = roles(pids_file)
        assert not [r for r, pid in tree.items() if alive(pid)]
        assert run.status().tasks["stubborn"].state == "cancelled"
        [attempt] = run.attempts("stubborn")
        assert attempt["outcome"] == "cancelled"
        assert _ended_after(attempt, asked) < 3
    finally:
        kill_all(roles(pids_file))


def test_output_beyond_the_cap_keeps_head_and_tail_and_says_what_was_dropped(
        ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    chatty = program("chatty", [PY, "-c", "for i in range(20000): print(f'line {{i}}')"],  # {{ }}: braces,
                     output_cap=1000)

    @pipeline
    def p():
        return chatty()

    run = p.run(store=ledger, executor="inline")
    res = run.result()
    total = sum(len(f"line {i}\n") for i in range(20000))
    assert res["stdout_bytes"] == total
    assert res["stdout_dropped"] == total - 1000
    assert res["stdout"].startswith("line 0\nline 1\n")
    assert res["stdout"].endswith("line 19998\nline 19999\n")
    assert f"[... {total - 1000} bytes dropped ...]" in res["stdout"]
    # every line reached the task's stdout, which the attempt's log keeps (head and tail)
    assert "line 10000\n" not in capsys.readouterr().out
    (log,) = run.logs("chatty")
    lines = log["text"].splitlines()
    assert lines[0] == "line 0" and lines[-1] == "line 19999"
    assert log["dropped"] == total - 64 * 1024


def test_an_exit_code_not_in_ok_codes_fails_with_the_code_and_stderr(ledger: str) -> None:
    bad = program("bad", ["sh", "-c", "echo first >&2; echo disk on fire >&2; exit 3"],
                  retries=1)
    fine = program("fine", ["sh", "-c", "exit 3"], ok_codes=(0, 3))

    @pipeline
    def p():
        return bad(), fine()

    run = p.run(store=ledger, executor="threads")
    tasks = run.status().tasks
    assert tasks["bad"].state == "failed"
    assert [a["outcome"] for a in run.attempts("bad")] == ["error", "error"]   # retried
    assert "exited with code 3" in (tasks["bad"].error or "")
    assert "disk on fire" in (tasks["bad"].error or "")
    assert run.result("fine")["exit_code"] == 3


def test_a_parameter_reaches_the_program_as_one_literal_argv_element(
        helpers: Path, tmp_path: Path, ledger: str) -> None:
    victim = tmp_path / "x"
    victim.mkdir()
    (victim / "keep").write_text("still here")
    dump = program("dump", [PY, str(helpers / "dump_argv.py"), "--name={name}", "{name}"],
                   cwd=str(tmp_path))

    @pipeline
    def p(name: str):
        return dump(name=name)

    res = p.run("a; rm -rf x", store=ledger, executor="threads").result()
    got = json.loads(res["stdout"])
    assert got == {"argv": ["--name=a; rm -rf x", "a; rm -rf x"], "env": "a; rm -rf x"}
    assert (victim / "keep").read_text() == "still here"


def test_a_memory_limit_hit_fails_with_a_reason_naming_the_limit(ledger: str) -> None:
    hog = program("hog", [PY, "-c", "x = bytearray(2 * 1024**3)"],
                  limits=Limits(memory_mb=400))

    @pipeline
    def p():
        return hog()

    run = p.run(store=ledger, executor="threads")
    error = run.status().tasks["hog"].error or ""
    assert run.status().tasks["hog"].state == "failed"
    assert "memory_mb limit" in error and "MemoryError" in error


def test_cpu_and_file_size_limits_name_themselves(tmp_path: Path) -> None:
    spin = program("spin", [PY, "-c", "while True: pass"], limits=Limits(cpu_s=1))
    with pytest.raises(ProgramError, match=r"(?s)cpu_s limit \(cpu_s=1\).*SIGXCPU") as info:
        spin()
    assert getattr(info.value, "limit", "") == "cpu_s"
    py = program("py", [PY, "-c", "open('big', 'wb').write(b'x' * 3 * 2**20)"],
                 limits=Limits(file_size_mb=1), cwd=str(tmp_path))
    with pytest.raises(ProgramError, match=r"(?s)file_size_mb limit.*File too large"):
        py()        # Python ignores SIGXFSZ: the write fails with EFBIG
    dd = program("dd", ["dd", "if=/dev/zero", "of=big", "bs=1M", "count=3"],
                 limits=Limits(file_size_mb=1), cwd=str(tmp_path))
    with pytest.raises(ProgramError, match=r"(?s)file_size_mb limit.*killed by SIGXFSZ"):
        dd()


def test_input_contents_are_in_the_fingerprint_and_outputs_become_lineage(
        tmp_path: Path, ledger: str) -> None:
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    upper = program("upper", ["sh", "-c", 'tr a-z A-Z < "$1" > "$2"', "sh", "{src}", "{dst}"],
                    inputs=["{src}"], outputs=["{dst}"])

    @pipeline
    def p(src: str, dst: str):
        return upper(src=src, dst=dst)

    dst = str(tmp_path / "out.txt")
    first = p.run(str(src), dst, store=ledger, executor="threads")
    assert Path(dst).read_text() == "HELLO\n"
    files = [r for r in first.lineage("upper") if not r["uri"].startswith("task:")]
    assert [(r["direction"], r["uri"]) for r in files] == [("input", str(src)), ("output", dst)]
    assert files[1]["content_hash"] == first.result()["outputs"][dst]
    again = p.run(str(src), dst, store=ledger, executor="threads")
    assert again.status().tasks["upper"].cached_from        # same argv, env, input bytes
    src.write_text("changed\n")
    third = p.run(str(src), dst, store=ledger, executor="threads")
    assert not third.status().tasks["upper"].cached_from
    assert Path(dst).read_text() == "CHANGED\n"


def test_map_passes_each_item_and_argv_env_are_in_the_version(ledger: str) -> None:
    echo = program("echo", ["echo", "{item}-{suffix}"])

    @pipeline
    def p():
        return echo.map(["a", "b"], suffix="z")

    assert [r["stdout"] for r in p.run(store=ledger, executor="threads").result()] == \
        ["a-z\n", "b-z\n"]
    assert program("v", ["echo", "1"]).version != program("v", ["echo", "2"]).version
    assert program("v", ["true"], env={"A": "1"}).version != \
        program("v", ["true"], env={"A": "2"}).version


def test_no_shell_unless_asked_and_placeholders_are_checked_when_traced(ledger: str) -> None:
    with pytest.raises(DefinitionError, match="without a shell"):
        program("bad", "echo hi")
    shelled = program("shelled", 'echo "$LEDGERFLOW_PARAM_WHO" {x}', shell=True)
    assert shelled(who="me; ls")["stdout"] == "me; ls {x}\n"    # not filled, not split
    needs = program("needs", ["echo", "{src}"])

    @pipeline
    def p():
        return needs(other=1)

    with pytest.raises(DefinitionError, match=r"without \['src'\]"):
        p.run(store=ledger, executor="inline")
    with pytest.raises(DefinitionError, match="need a sandbox"):
        program("net", ["true"], network=False)


def test_a_missing_program_and_a_missing_output_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ProgramError, match="could not start '/no/such/tool'"):
        program("ghost", ["/no/such/tool"])()
    with pytest.raises(ProgramError, match="did not write its declared output"):
        program("lazy", ["true"], outputs=[str(tmp_path / "never")])()


def test_processes_left_behind_by_a_program_that_exited_are_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg"
    quits = program("quits", ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 0"],
                    grace=0.2)
    assert quits()["exit_code"] == 0
    assert not alive(int(pid_file.read_text()))


@pytest.mark.skipif(not Path("/usr/bin/pdftotext").exists() and
                    not any(Path(p, "pdftotext").exists()
                            for p in os.environ.get("PATH", "").split(os.pathsep)),
                    reason="pdftotext is not installed (Debian package poppler-utils)")
def test_pdftotext_through_program(ledger: str) -> None:
    pdf = ROOT / "recipes" / "doc_index" / "corpus" / "pdf" / "difflib-sequencematcher.pdf"
    to_text = program("pdftotext", ["pdftotext", "-layout", "{src}", "-"], inputs=["{src}"],
                      timeout=60)

    @pipeline
    def p(src: str):
        return to_text(src=src)

    run = p.run(str(pdf), store=ledger, executor="processes")
    text = run.result()["stdout"]
    assert "SequenceMatcher is a flexible class" in text
    assert str(pdf) in [r["uri"] for r in run.lineage("pdftotext")]


def test_ledgerflow_program_is_the_same_function() -> None:
    assert ledgerflow.program("e", ["echo", "ok"])()["stdout"] == "ok\n"
