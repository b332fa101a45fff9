"""The executor contract and per-attempt logs on a real Dask cluster."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow.executor import Executor
from ledgerflow.testing import ExecutorContract
from ledgerflow_dask import DaskExecutor


class TestDaskContract(ExecutorContract):
    executor_name = "dask"
    patience = 60.0

    @pytest.fixture(autouse=True)
    def _client(self, shared_client: Any) -> Iterator[None]:
        self.client = shared_client
        yield

    def make_executor(self) -> Executor:
        return DaskExecutor(client=self.client, cancel_grace=0.5)


@ledgerflow.task(retries=1)
def talk(i: int) -> int:
    ctx = ledgerflow.context()
    print(f"out {i} attempt {ctx.attempt}")
    logging.getLogger("flow").warning("warned %d", i)
    if i == 1 and ctx.attempt == 1:
        raise ValueError("first try fails")
    return i


@ledgerflow.pipeline
def talking():
    return talk.map([0, 1])


def test_output_reaches_the_logs_on_dask(shared_client: Any, tmp_path: Path) -> None:
    run = talking.run(store=str(tmp_path / "l.duckdb"),
                      executor=DaskExecutor(client=shared_client))
    assert run.state == "succeeded"
    by = {(r["task_key"], r["attempt"]): r["text"].splitlines() for r in run.logs()}
    assert by == {("talk[0]", 1): ["out 0 attempt 1", "WARNING flow: warned 0"],
                  ("talk[1]", 1): ["out 1 attempt 1", "WARNING flow: warned 1"],
                  ("talk[1]", 2): ["out 1 attempt 2", "WARNING flow: warned 1"]}
