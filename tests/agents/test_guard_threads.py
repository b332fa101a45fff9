"""The runtime guard follows the threads a tool starts and the pool work it submits."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any

from ledgerflow import pipeline
from ledgerflow_agents import Arg, MockModel, agent_task, tool

#: made before any tool runs: its worker thread does not start under a guard
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1)


def _write(path: str) -> None:
    with open(path, "w") as fh:
        fh.write("escaped\n")


@tool(writes=[Arg("out")])
def in_thread(name: str, *, out: str) -> str:
    """Write a file from a thread it starts (the name may lead anywhere)."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            _write(str(Path(out) / name))
        except BaseException as exc:     # the thread swallows it, as threads do
            errors.append(exc)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    return "written" if not errors else f"thread failed: {errors[0]}"


@tool(writes=[Arg("out")])
def in_pool(name: str, *, out: str) -> str:
    """Write a file from a thread pool made before the call."""
    _POOL.submit(_write, str(Path(out) / name)).exception()
    return "submitted"


def _run(tmp_path: Path, t: Any, name: str) -> Any:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    mock = MockModel(turns=[{"tool_calls": [{"name": t.name, "arguments": {"name": name}}]},
                            {"text": "done"}])

    @agent_task(model=mock, tools=[t], corrections=0)
    def writer(question: str, out: str) -> str:
        return question

    @pipeline
    def flow(out: str):
        return writer("write it", out)

    return flow.run(str(out), store=str(tmp_path / "ledger.duckdb"))


def test_a_thread_the_tool_starts_is_under_the_guard(tmp_path: Path) -> None:
    run = _run(tmp_path, in_thread, "../escaped.txt")
    row = run.status().tasks["writer"]
    assert row.state == "failed" and "PathNotAllowed" in row.error
    assert not (tmp_path / "escaped.txt").exists()
    assert [c["outcome"] for c in run.tool_calls()] == ["refused"]
    (n,) = [n for n in run.notices() if n["kind"] == "path_not_allowed"]
    assert "escaped.txt" in n["message"] and "may not write" in n["message"]


def test_pool_work_the_tool_submits_is_under_the_guard(tmp_path: Path) -> None:
    run = _run(tmp_path, in_pool, "../escaped.txt")
    assert run.status().tasks["writer"].state == "failed"
    assert not (tmp_path / "escaped.txt").exists()
    assert [c["outcome"] for c in run.tool_calls()] == ["refused"]


def test_a_thread_writing_inside_the_roots_is_fine_and_the_pool_is_free_after(
        tmp_path: Path) -> None:
    run = _run(tmp_path, in_thread, "inside.txt")
    assert run.result() == "done" and (tmp_path / "out" / "inside.txt").exists()
    _POOL.submit(_write, str(tmp_path / "after.txt")).result()     # no guard outside a call
    assert (tmp_path / "after.txt").exists()


def test_a_bare_thread_is_under_the_guard_too(tmp_path: Path) -> None:
    import _thread

    from ledgerflow_agents.guard import Guard, guarded

    done = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            _write(str(tmp_path / "escaped.txt"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    g = Guard("t", reads=(), writes=(str(tmp_path / "out"),))
    with guarded(g):
        _thread.start_new_thread(work, ())
        assert done.wait(60)
    assert type(errors[0]).__name__ == "PathNotAllowed"
    assert g.violations and not (tmp_path / "escaped.txt").exists()
