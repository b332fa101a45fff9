"""The watch loop: file events and schedule slots become ordinary runs, one at a time.

What it watches. The paths given with ``--path``, plus the values of the
pipeline parameters its module names in ``LEDGERFLOW_WATCH`` (the doc index:
``LEDGERFLOW_WATCH = ("source",)``), after defaults and ``-p`` are applied.

Nothing is lost. The file watcher (``watchfiles``) starts before the first run
and runs in its own thread for the watcher's whole life; each change lands in
one pending set. A run starts once no change came for ``debounce`` seconds, and
takes the whole set at that instant: a change made during a run stays pending
and starts the next run. The runs are incremental (unchanged documents are
cache hits), and the first run, at start, catches up with whatever changed
while no watcher ran, so a killed watcher loses nothing either.

Each run is an ordinary run in the ledger; its ``RunDefined.options`` carry
``trigger``: ``{"kind": "start"|"files"|"every"|"cron", "paths": [...],
"changes": n, "slot": iso|None, "missed": n, "watcher_pid": pid}``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgerflow.errors import InputError, PipelineError
from ledgerflow.records import RunDefined
from ledgerflow.views import iso

from .schedule import Schedule

#: The module attribute naming the pipeline parameters whose values are watched paths.
WATCH_ATTRIBUTE = "LEDGERFLOW_WATCH"
#: At most this many changed paths are recorded in a run's trigger (the count is exact).
TRIGGER_PATHS = 50


def watched_paths(pipe: Any, values: dict[str, Any], extra: Sequence[str]) -> list[str]:
    """The absolute paths to watch: ``extra`` and the parameters the module declares."""
    module = sys.modules.get(getattr(pipe.fn, "__module__", ""), None)
    names = getattr(module, WATCH_ATTRIBUTE, ()) if module is not None else ()
    if isinstance(names, str):
        names = (names,)
    raw: list[str] = list(extra)
    for name in names:
        if name not in values:
            raise InputError(f"{WATCH_ATTRIBUTE} names {name!r}, which is not a parameter "
                             f"of pipeline {pipe.name}",
                             hint=f"list parameter names in {WATCH_ATTRIBUTE}")
        value = values[name]
        raw.extend(value if isinstance(value, (list, tuple)) else [value])
    out: list[str] = []
    for p in raw:
        path = Path(str(p)).expanduser().resolve()
        if not path.exists():
            raise InputError(f"watched path not found: {p}",
                             hint="create it, or pass another one (-p / --path)")
        if str(path) not in out:
            out.append(str(path))
    return out


class Pending:
    """Changed paths not yet handed to a run, and when the last one came (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[str, str] = {}
        self._count = 0
        self.last = 0.0                 # monotonic time of the last change
        self.failure: BaseException | None = None     # the file watcher's, if it failed
        self.wake = threading.Event()

    def add(self, changes: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            for kind, path in changes:
                self._paths[path] = kind
                self._count += 1
            self.last = time.monotonic()
        self.wake.set()

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._paths)

    def quiet_for(self) -> float:
        return time.monotonic() - self.last

    def take(self) -> tuple[list[str], int]:
        """All pending paths (sorted) and the number of events, leaving none."""
        with self._lock:
            paths, count = sorted(self._paths), self._count
            self._paths, self._count = {}, 0
            return paths, count


def _visible(_change: Any, path: str) -> bool:
    """watchfiles' default filter, and no hidden file or folder (the doc index skips them)."""
    from watchfiles import DefaultFilter
    return DefaultFilter()(_change, path) and not any(
        part.startswith(".") for part in Path(path).parts[1:])


def follow(paths: list[str], pending: Pending, stop: threading.Event,
           ready: threading.Event) -> None:
    """Feed file events under ``paths`` into ``pending`` until ``stop`` (a thread's body).

    If watching fails (a watched folder vanished...), ``pending.failure`` says why and
    the loop stops with that error rather than miss changes silently.
    """
    import watchfiles
    try:
        for batch in watchfiles.watch(*paths, watch_filter=_visible, stop_event=stop,
                                      debounce=200, step=20, rust_timeout=100,
                                      yield_on_timeout=True, raise_interrupt=False):
            ready.set()
            if batch:
                pending.add((c.name, p) for c, p in batch)
    except Exception as exc:  # reported by the loop, which stops
        pending.failure = exc
        pending.wake.set()
    finally:
        ready.set()


class TriggerStore:
    """The ledger, passed to a run, writing the run's trigger into its ``RunDefined``
    options (every other call goes to the ledger itself)."""

    def __init__(self, store: Any, trigger: dict[str, Any]) -> None:
        self._store = store
        self._trigger = trigger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def create_run(self, run_id: str, records: Sequence[Any]) -> Any:
        for r in records:
            if isinstance(r, RunDefined):
                opts = json.loads(r.options or "{}")
                opts["trigger"] = self._trigger
                r.options = json.dumps(opts, sort_keys=True)
        return self._store.create_run(run_id, records)


def lock_target(store: Any, key: str) -> Any:
    """Hold the lock 'one watcher per target' beside a file ledger (None: not a file)."""
    location = str(getattr(store, "location", "") or "")
    if "://" in location or location.startswith(("memory", ":memory:")) or not location:
        return None
    from ledgerflow.keys import digest
    folder = Path(location).resolve().parent
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"watch-{digest(key.encode())[:12]}.lock"
    fh = open(path, "a+")      # held open for the watcher's life
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        other = fh.read().strip() or "?"
        fh.close()
        raise InputError(f"this target is already watched with these parameters "
                         f"(watcher pid {other})",
                         hint="stop that watcher first (Ctrl-C), or watch other parameters") \
            from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh


@dataclass
class Watch:
    """One watcher: what starts a run (paths, schedule), and how a run is started.

    ``start_run(run_id, trigger, cancel)`` drives one run to its end and returns
    what to report of it (``state``, counts); ``report(event)`` gets a dict per
    run started and ended.
    """

    paths: list[str]
    schedule: Schedule | None
    debounce: float
    start_run: Callable[[str, dict[str, Any], threading.Event], dict[str, Any]]
    new_run_id: Callable[[], str]
    report: Callable[[dict[str, Any]], None]
    max_runs: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)
    pending: Pending = field(default_factory=Pending)
    runs: int = 0

    def loop(self) -> None:
        """Catch up once, then run after each settled change or due slot, until stopped."""
        thread = None
        if self.paths:
            ready = threading.Event()
            thread = threading.Thread(target=follow, name="ledgerflow-watch-files",
                                      args=(self.paths, self.pending, self.stop, ready),
                                      daemon=True)
            thread.start()
            ready.wait(30)      # the watcher sees changes from here on
        try:
            last = time.time()       # slots between the last one run and the next: missed
            self._run({"kind": "start", "paths": [], "changes": 0, "slot": None,
                       "missed": 0})
            slot = self.schedule.next_after(time.time()) if self.schedule else None
            while not self._done():
                if self.pending.failure is not None:
                    exc = self.pending.failure
                    raise InputError(f"watching {', '.join(self.paths)} failed: "
                                     f"{type(exc).__name__}: {exc}",
                                     hint="check that the watched paths still exist, "
                                     "then start the watch again (it catches up)")
                if self.pending and self.pending.quiet_for() >= self.debounce:
                    paths, count = self.pending.take()
                    self._run({"kind": "files", "paths": paths[:TRIGGER_PATHS],
                               "changes": count, "slot": None, "missed": 0})
                    continue
                if slot is not None and time.time() >= slot:
                    assert self.schedule is not None
                    missed = self.schedule.missed(last, slot)
                    self._run({"kind": self.schedule.kind, "paths": [], "changes": 0,
                               "slot": iso(slot), "missed": missed})
                    last, slot = slot, self.schedule.next_after(time.time())
                    continue
                self._sleep(slot)
        finally:
            self.stop.set()
            if thread is not None:
                thread.join(5)

    def _done(self) -> bool:
        return self.stop.is_set() or (self.max_runs is not None and self.runs >= self.max_runs)

    def _sleep(self, slot: float | None) -> None:
        wait = 0.5
        if self.pending:
            wait = min(wait, max(0.01, self.debounce - self.pending.quiet_for()))
        if slot is not None:
            wait = min(wait, max(0.01, slot - time.time()))
        self.pending.wake.clear()
        if not self.stop.is_set():
            self.pending.wake.wait(wait)

    def _run(self, trigger: dict[str, Any]) -> None:
        if self._done():
            return
        trigger = {**trigger, "watcher_pid": os.getpid()}
        run_id = self.new_run_id()
        self.runs += 1
        began = time.monotonic()
        self.report({"event": "start", "run_id": run_id, "trigger": trigger,
                     "at": time.time()})
        try:
            done = self.start_run(run_id, trigger, self.cancel)
        except PipelineError as exc:
            if self.runs == 1 and exc.exit_code == 2:
                raise           # bad input before anything ran: the watch cannot start
            done = {"state": "failed", "error": str(exc)}
        self.report({"event": "end", "run_id": run_id, **done, "trigger": trigger,
                     "seconds": round(time.monotonic() - began, 3), "at": time.time(),
                     "pending": bool(self.pending)})
