"""The ``mock`` executor: scripted outcomes per task, for tests.

A script maps a task key (or a task name) to what its attempts do:

* ``{"fail": 2}``: the first two attempts raise, later ones run the task;
* ``{"value": 5}``: return 5 without calling the function;
* ``{"error": "nonretryable"}``: raise :class:`~ledgerflow.NonRetryableError`;
* ``{"hang": true}``: block until cancelled, then confirm ``cancelled``;
* ``{"timeout": true}``: never answer in time; once abandoned, stop silently;
* ``{"late": 0.5}``: ignore cancellation, deliver a result 0.5 s later;
* ``{"twice": true}``: report the success twice;
* ``{"sleep": 0.2}``: sleep, then run the task.

Pass it as ``MockExecutor(script)``, or set ``LEDGERFLOW_MOCK_SCRIPT`` to the
JSON text (or ``@path`` of a JSON file) when using ``--executor mock``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ledgerflow import NonRetryableError, hookimpl
from ledgerflow.config import Settings
from ledgerflow.executor import Completion, Job, execute


class MockFailure(RuntimeError):
    """The error a scripted failure raises."""


class MockExecutor:
    """Runs each job on its own thread, following the script."""

    name = "mock"

    def __init__(self, script: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.script = dict(script or {})
        self._done: Callable[[Completion], None] | None = None
        self._flags: dict[int, threading.Event] = {}
        self._abandoned: set[int] = set()
        self.submitted: list[tuple[str, int]] = []

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        self._done = on_complete

    def _rule(self, job: Job) -> Mapping[str, Any]:
        return self.script.get(job.task_key) or self.script.get(job.task_name) or {}

    def submit(self, job: Job) -> None:
        self.submitted.append((job.task_key, job.attempt))
        flag = self._flags[job.id] = threading.Event()
        threading.Thread(target=self._run, args=(job, flag), daemon=True,
                         name=f"mock-{job.task_key}").start()

    def _report(self, c: Completion) -> None:
        if self._done is not None:
            self._done(c)

    def _run(self, job: Job, flag: threading.Event) -> None:
        rule = self._rule(job)
        now = time.time()
        if rule.get("sleep"):
            time.sleep(float(rule["sleep"]))
        if rule.get("hang") or rule.get("timeout"):
            flag.wait()
            if job.id not in self._abandoned:
                self._report(Completion(job.id, "cancelled", started_at=now,
                                        ended_at=time.time(), has_value=False))
            return
        if "late" in rule:
            time.sleep(float(rule["late"]))
            self._report(self._call(job, rule, flag))
            return
        if job.attempt <= int(rule.get("fail", 0)):
            c = execute(_scripted(job, _raiser(MockFailure(f"scripted failure {job.attempt}"))),
                        flag.is_set)
            self._report(c)
            return
        if rule.get("error") == "nonretryable":
            self._report(execute(_scripted(job, _raiser(NonRetryableError("scripted: do not retry"))),
                                 flag.is_set))
            return
        c = self._call(job, rule, flag)
        self._report(c)
        if rule.get("twice"):
            self._report(c)

    def _call(self, job: Job, rule: Mapping[str, Any], flag: threading.Event) -> Completion:
        if "value" in rule:
            value = rule["value"]
            job = _scripted(job, lambda: value)
        return execute(job, flag.is_set)

    def cancel(self, job_id: int, *, reason: str) -> None:
        if reason == "timeout":
            self._abandoned.add(job_id)
        flag = self._flags.get(job_id)
        if flag is not None:
            flag.set()

    def shutdown(self) -> None:
        for flag in self._flags.values():
            flag.set()
        self._done = None


def _scripted(job: Job, fn: Callable[[], Any]) -> Job:
    """``job`` with its function replaced by a scripted one (no arguments)."""
    return replace(job, fn=fn, args=(), kwargs={})


def _raiser(exc: BaseException) -> Callable[[], Any]:
    def boom() -> Any:
        raise exc
    return boom


def load_script(raw: str) -> dict[str, Any]:
    """Parse ``LEDGERFLOW_MOCK_SCRIPT``: JSON text or ``@path``."""
    if raw.startswith("@"):
        with open(raw[1:]) as fh:
            raw = fh.read()
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("the mock script must be a JSON object")
    return data


@hookimpl
def ledgerflow_executor_names() -> list[str]:
    return ["mock"]


@hookimpl
def ledgerflow_make_executor(name: str, settings: Settings) -> MockExecutor | None:
    if name != "mock":
        return None
    raw = settings.options.get("mock_script") or os.environ.get("LEDGERFLOW_MOCK_SCRIPT", "")
    return MockExecutor(load_script(raw) if raw else {})
