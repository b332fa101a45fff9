"""One contract for every built-in local executor (dask: tests/dask)."""

from __future__ import annotations

import pytest

from ledgerflow.testing import ExecutorContract


class TestInline(ExecutorContract):
    executor_name = "inline"

    def test_a_cancel_is_confirmed(self) -> None:
        pytest.skip("inline runs a job inside submit(), so nothing can call cancel() while "
                    "it runs; test_a_run_cancel_reaches_a_running_task covers its cancels")


class TestThreads(ExecutorContract):
    executor_name = "threads"


class TestProcesses(ExecutorContract):
    executor_name = "processes"


class TestMock(ExecutorContract):
    executor_name = "mock"
