"""The per-attempt step and call logs: one file format, written by workers, read by the driver.

A task's steps (``context().step``) and its model calls, tool calls and
notices are reported with the attempt's :class:`~ledgerflow.executor.Completion`.
An attempt whose process dies never reports, so each is also appended *as it
happens* to a log in the run's folder (stores with a folder only), which the
driver reads when it needs what such an attempt did:

* ``RUN_FOLDER/steps/<digest of task key>.jsonl``: one line per step,
  ``{"attempt", "name", "kind", "data", "hash"}`` (a re-run gets the result
  back instead of doing the step again);
* ``RUN_FOLDER/calls/<digest of task key>.jsonl``: one line per call or
  notice, ``{"attempt", "kind": "model" | "tool" | "notice", "fields"}``
  (journaled by a resume for an attempt ``lost`` with its process).

Each line is one ``write`` of an ``O_APPEND`` file, so a crash leaves at most a
torn last line, which the readers skip.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from . import private
from .keys import digest
from .records import ModelCall, Notice, Record, ToolCall

#: Defaults of the fields a task may leave out when it records a model or tool call.
_MODEL_CALL: dict[str, Any] = {
    "seq": 0, "provider": "", "model": "", "key_alias": "", "request_hash": "",
    "response_hash": "", "input_tokens": 0, "output_tokens": 0, "cost": 0.0,
    "latency": 0.0, "finish_reason": "", "tool_calls": [], "reserved_tokens": 0,
    "reserved_cost": 0.0, "replayed": False, "content": ""}
_TOOL_CALL: dict[str, Any] = {
    "seq": 0, "tool": "", "arguments_digest": "", "approved_by": "", "outcome": "",
    "result_hash": "", "error": "", "replayed": False}


def step_log_path(run_folder: str, task_key: str) -> str:
    """The file a task's steps are appended to as they complete (durable at once)."""
    return os.path.join(run_folder, "steps", digest(task_key.encode()) + ".jsonl")


def call_log_path(run_folder: str, task_key: str) -> str:
    """The file a task's model calls, tool calls and notices are appended to."""
    return os.path.join(run_folder, "calls", digest(task_key.encode()) + ".jsonl")


# -- the worker side ---------------------------------------------------------------------

def append_step(run_folder: str, task_key: str, attempt: int, name: str, kind: str,
                data: str, chash: str) -> None:
    """Append one step result to the task's step log."""
    _append_line(step_log_path(run_folder, task_key),
                 json.dumps({"attempt": attempt, "name": name, "kind": kind, "data": data,
                             "hash": chash}))


def append_call(run_folder: str, task_key: str, attempt: int, kind: str,
                fields: dict[str, Any]) -> None:
    """Append one call (``kind`` model or tool) or notice to the task's call log."""
    _append_line(call_log_path(run_folder, task_key),
                 json.dumps({"attempt": attempt, "kind": kind, "fields": fields},
                            default=str))


def _append_line(path: str, line: str) -> None:
    """Append one line in one ``write`` (a crash leaves at most a torn last line)."""
    private.make_dirs(os.path.dirname(path))
    fd = private.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


# -- the driver side ---------------------------------------------------------------------

def read_lines(path: str) -> list[dict[str, Any]]:
    """The entries of a log (a torn last line is left out; no file: none)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def logged_steps(run_folder: str, task_key: str) -> list[tuple[str, str, str]]:
    """The steps in a task's step log, oldest first: (name, kind, data)."""
    return [(e["name"], e["kind"], e["data"])
            for e in read_lines(step_log_path(run_folder, task_key))]


class StepResults:
    """The step results a run recorded, by task: what an attempt gets back instead of
    doing a step again (``context().step``)."""

    __slots__ = ("by_task", "run_folder")

    _NONE: dict[str, tuple[str, str]] = {}

    def __init__(self, run_folder: str | None) -> None:
        self.run_folder = run_folder
        self.by_task: dict[str, dict[str, tuple[str, str]]] = {}

    def load(self, rows: Iterable[dict[str, Any]]) -> None:
        """The steps a prior drive journaled (``RunStore.steps``)."""
        for st in rows:
            self.by_task.setdefault(st["task_key"], {})[st["name"]] = (st["kind"], st["data"])

    def reported(self, task_key: str, steps: Sequence[tuple[str, str, str, str]]) -> None:
        """The steps an ended attempt reported: (name, kind, data, hash)."""
        if steps:
            recorded = self.by_task.setdefault(task_key, {})
            for name, kind, data, _ in steps:
                recorded[name] = (kind, data)

    def for_attempt(self, task_key: str, attempt: int) -> dict[str, tuple[str, str]]:
        """The steps attempt ``attempt`` gets: those journaled and, for attempts that never
        reported (e.g. lost with their process), those in the task's step log."""
        if attempt <= 1 or self.run_folder is None:
            return self.by_task.get(task_key, self._NONE)
        recorded = self.by_task.setdefault(task_key, {})
        for name, kind, data in logged_steps(self.run_folder, task_key):
            recorded.setdefault(name, (kind, data))
        return recorded


def logged_calls(run_folder: str, task_key: str, attempt: int) -> list[Record]:
    """The records of the calls and notices one attempt of a task logged."""
    out: list[Record] = []
    for e in read_lines(call_log_path(run_folder, task_key)):
        if e.get("attempt") == attempt and e.get("kind") in ("model", "tool", "notice"):
            out += call_records(task_key, attempt, **{e["kind"]: [e["fields"]]})
    return out


def call_records(key: str, attempt: int, model: Sequence[dict[str, Any]] = (),
                 tool: Sequence[dict[str, Any]] = (),
                 notice: Sequence[dict[str, Any]] = ()) -> list[Record]:
    """Records of an attempt's model calls, tool calls and notices (fields as reported)."""
    out: list[Record] = []
    for call in model:
        out.append(ModelCall(**{**_MODEL_CALL, **call, "task_key": key, "attempt": attempt}))
    for call in tool:
        out.append(ToolCall(**{**_TOOL_CALL, **call, "task_key": key, "attempt": attempt}))
    for n in notice:
        out.append(Notice(key, attempt, str(n.get("kind", "")), str(n.get("message", "")),
                          float(n.get("ts") or time.time())))
    return out
