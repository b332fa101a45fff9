"""A printed status is one line a person can read, whatever the size of the run."""

from __future__ import annotations

from ledgerflow import pipeline, task


@task
def square(x: int) -> int:
    return x * x


@pipeline
def squares(n: int = 200):
    return square.map(list(range(n)))


def test_repr_of_a_status_is_one_short_line(tmp_path) -> None:
    run = squares.run(store=str(tmp_path / "l.duckdb"), executor="inline")
    text = repr(run.status())
    assert "\n" not in text and len(text) < 200
    assert run.run_id in text and "succeeded" in text and "200 succeeded" in text
    row = repr(run.status().tasks["square[3]"])
    assert row == "TaskRow('square[3]', succeeded, attempts=1)"


def test_in_order_lists_each_task_after_what_it_reads_else_as_made() -> None:
    from ledgerflow.views import RunView, TaskRow
    rows = [TaskRow("fetch"), TaskRow("total", node="total", upstream=["square"]),
            TaskRow("square[0]", node="square", position=0, upstream=["fetch"]),
            TaskRow("square[1]", node="square", position=1, upstream=["fetch"]),
            TaskRow("lone", upstream=["gone"]),       # an upstream the ledger does not hold
            TaskRow("a", upstream=["b"]), TaskRow("b", upstream=["a"])]   # damaged: a cycle
    view = RunView("r", tasks={r.key: r for r in rows})
    assert [r.key for r in view.in_order()] == ["fetch", "square[0]", "square[1]", "total",
                                                "lone", "a", "b"]
