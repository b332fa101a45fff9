"""A ``pipeline watch`` subprocess whose JSON lines are read as they come, with bounded waits."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
DOC_INDEX = ROOT / "recipes" / "doc_index" / "pipeline.py"


#: A pipeline of one uncached task that sleeps ``seconds`` (a run whose length a test sets).
TICKING = """\
import time
from ledgerflow import pipeline, task

@task(cache=False)
def tick(seconds: float) -> float:
    time.sleep(seconds)
    return time.time()

@pipeline
def ticking(seconds: float = 0.0) -> float:
    return tick(seconds)
"""


def watch_command() -> list[str]:
    """``pipeline watch`` once the plugin is registered, else the same command by module."""
    if any(ep.name == "watch" for ep in entry_points(group="ledgerflow")):
        return [sys.executable, "-m", "ledgerflow", "watch"]
    return [sys.executable, "-m", "ledgerflow_watch"]


def env_for(folder: Path) -> dict[str, str]:
    path = os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1",
            "LEDGERFLOW_STORE": str(folder / "ledger.duckdb")}


class Watcher:
    """One ``pipeline watch ... --json`` process; :meth:`next_event` reads its lines."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.proc = subprocess.Popen([*watch_command(), *args, "--json"], cwd=folder,
                                     env=env_for(folder), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._drain, daemon=True)]
        for t in self.readers:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.events.put(json.loads(line))
        self.events.put(None)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def next_event(self, timeout: float = 120.0) -> dict[str, Any]:
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event from the watcher in {timeout:g}s; stderr:\n"
                                 + "".join(self.stderr[-30:])) from None
        if event is None:
            raise AssertionError(f"the watcher exited ({self.proc.wait()}); stderr:\n"
                                 + "".join(self.stderr[-30:]))
        self.seen.append(event)
        return event

    def next_end(self, timeout: float = 120.0) -> dict[str, Any]:
        while True:
            event = self.next_event(timeout)
            if event["event"] == "end":
                return event

    def stop(self, timeout: float = 60.0) -> int:
        """Ctrl-C, and its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        finally:
            self._close()

    def kill(self) -> None:
        """kill -9."""
        self.proc.kill()
        self.proc.wait(30)
        self._close()

    def drain(self) -> list[dict[str, Any]]:
        """Every event read so far, those not yet taken included (after :meth:`stop`)."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return self.seen
            if event is not None:
                self.seen.append(event)

    def _close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for t in self.readers:
            t.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def wait_for(probe: Any, timeout: float = 60.0, what: str = "") -> Any:
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
