"""What the CLI prints: progress while a run is driven, tables and lines after.

One counter model (:class:`Counts`) is fed by the runner's transitions
(after their commit) and shared by the terminal bar and the plain lines.
Output for big runs is aggregated by task name above :data:`ROW_LIMIT` rows.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import click
import msgspec

from ..states import FAILED_LIKE, IN_FLIGHT, TERMINAL, TaskState
from ..views import RunView, TaskGroup, TaskRow, counts_text, iso

#: Above this many tasks, tables and logs show one row per task name.
ROW_LIMIT = 50
#: ``pipeline status`` lists every task of a run up to this many (beyond: per name).
STATUS_ROWS = 500
#: Per-task lines printed for failures before they are only counted.
FAILURE_LINES = 20
_TERMINAL = frozenset(s.value for s in TERMINAL)
_FAILED_LIKE = frozenset(s.value for s in FAILED_LIKE)
_IN_FLIGHT = frozenset(s.value for s in IN_FLIGHT)
_COLOURS: dict[str, str] = {TaskState.SUCCEEDED: "green", TaskState.FAILED: "red",
            TaskState.UPSTREAM_FAILED: "red", TaskState.CANCELLED: "yellow",
            TaskState.RUNNING: "cyan", TaskState.CANCELLING: "yellow"}


class Counts:
    """Tasks by state, moved by transitions (starts from a resumed run's counts)."""

    def __init__(self, initial: Mapping[str, int] | None = None) -> None:
        self.by_state: dict[str, int] = dict(initial or {})

    def move(self, old: str, new: str) -> None:
        c = self.by_state
        if old:
            c[old] = c.get(old, 0) - 1
            if c[old] <= 0:
                del c[old]
        c[new] = c.get(new, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.by_state.values())

    @property
    def ended(self) -> int:
        return sum(n for s, n in self.by_state.items() if s in _TERMINAL)

    def get(self, state: str) -> int:
        return self.by_state.get(state, 0)


class Lines:
    """Plain progress lines for pipes and logs."""

    def __init__(self, initial: Mapping[str, int] | None = None, *,
                 echo: Any = None) -> None:
        self.counts = Counts(initial)
        self.echo = echo or out
        self.last = time.monotonic()
        self.printed_ok = 0
        self.printed_bad = 0

    def begin(self, counts: Mapping[str, int]) -> None:
        """Start from a resumed run's counts (read by the resume itself)."""
        self.counts = Counts(counts)
        self.restoring = True

    #: A resume restores the prior rows before it dispatches: a task that leaves an
    #: in-flight state then lost its attempt with the driver (not a failure).
    restoring = False

    def __call__(self, key: str, old: str, new: str) -> None:
        self.counts.move(old, new)
        if self.restoring and new == TaskState.RUNNING:
            self.restoring = False
        if self.restoring:
            if old in _IN_FLIGHT:
                self.echo(f"  {'lost':<15} {key}  (its attempt died with the driver; "
                          "it runs again)")
            return
        if new in _FAILED_LIKE:
            if self.printed_bad < FAILURE_LINES:
                self.printed_bad += 1
                self.echo(f"  {new:<15} {key}")
        elif new == TaskState.SUCCEEDED and self.counts.total <= ROW_LIMIT:
            self.printed_ok += 1
            self.echo(f"  {new:<15} {key}")
        if time.monotonic() - self.last > 5:
            self.last = time.monotonic()
            self.echo(f"  ... {counts_text(self.counts.by_state)}")

    def close(self) -> None:
        bad = sum(self.counts.get(s) for s in _FAILED_LIKE)
        if bad > self.printed_bad:
            self.echo(f"  ... and {bad - self.printed_bad} more that did not succeed "
                      "(pipeline status lists them)")


class Bar:
    """A live rich progress bar on a terminal.

    Every figure of a frame (the bar, done/total, running, failed) is read from one
    copy of the counts taken as the frame is drawn (rich redraws 10 times a second),
    so a frame never pairs a fresh running count with a stale total.
    """

    def __init__(self, initial: Mapping[str, int] | None = None) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        bar = self

        class Frame(Progress):
            def get_renderables(self) -> Any:
                bar.shown = dict(bar.counts.by_state)       # one copy for the whole frame
                yield from super().get_renderables()

        class Filled(BarColumn):
            def render(self, task: Any) -> ProgressBar:
                total, ended = bar.figures()[:2]
                return ProgressBar(total=total or None, completed=ended, pulse=not total,
                                   animation_time=task.get_time(), style=self.style,
                                   complete_style=self.complete_style,
                                   finished_style=self.finished_style,
                                   pulse_style=self.pulse_style)

        class Done(ProgressColumn):
            def render(self, task: Any) -> Text:
                total, ended = bar.figures()[:2]
                return Text(f"{ended}/{total or '?'}", style="progress.download")

        class Detail(ProgressColumn):
            def render(self, task: Any) -> Text:
                running, failed = bar.figures()[2:]
                return Text(f"running {running}  failed {failed}")

        self.counts = Counts(initial)
        self.shown: dict[str, int] = dict(self.counts.by_state)
        self.progress = Frame(TextColumn("{task.description}"), Filled(), Done(), Detail(),
                              TimeElapsedColumn(), transient=False)
        self.task = self.progress.add_task("tasks", total=None)
        self.progress.start()

    def figures(self) -> tuple[int, int, int, int]:
        """``(total, ended, running, failed)`` of the frame being drawn."""
        c = Counts(self.shown)
        return c.total, c.ended, c.get(TaskState.RUNNING), c.get(TaskState.FAILED)

    def begin(self, counts: Mapping[str, int]) -> None:
        """Start from a resumed run's counts (read by the resume itself)."""
        self.counts = Counts(counts)

    def __call__(self, key: str, old: str, new: str) -> None:
        self.counts.move(old, new)      # drawn at the next frame

    def close(self) -> None:
        self.progress.stop()            # its last frame reads the final counts


def progress_for(as_json: bool, initial: Mapping[str, int] | None = None) -> Any:
    """The progress display of a CLI run: none for ``--json``, a bar on a terminal."""
    if as_json:
        return None
    return Bar(initial) if sys.stdout.isatty() else Lines(initial)


def run_json(view: RunView) -> dict[str, Any]:
    """``status --json`` (and ``run``/``resume --json``): the run, its tasks, and its
    root cause (the earliest task that failed by itself, or null)."""
    doc = view.as_json()
    causes = view.root_causes() if view.groups is None else \
        [view.first_failure] if view.first_failure is not None else []
    first = causes[0] if causes else None
    doc["root_cause"] = None if first is None else {"key": first.key, "error": first.error}
    return doc


def attempts_json(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attempts with ISO times, as the task rows have them."""
    return [{**a, "started_at": iso(a.get("started_at")), "ended_at": iso(a.get("ended_at"))}
            for a in attempts]


def dumps(doc: object) -> str:
    """JSON for ``--json`` outputs (indented; every command uses this)."""
    return json.dumps(doc, indent=2, default=str)


def run_dumps(view: RunView) -> str:
    """``dumps(run_json(view))``, written by msgspec: a run's document holds only
    strings, whole numbers, booleans, nulls, lists and objects, which msgspec writes
    byte for byte as :func:`dumps` does, ~8 times faster (a 100,000-task run: 0.61 ->
    0.07 s). A document with other than ASCII text goes through :func:`dumps`, which
    escapes it."""
    doc = run_json(view)
    text = msgspec.json.format(msgspec.json.encode(doc), indent=2)
    return text.decode() if text.isascii() else dumps(doc)


def _duration(r: TaskRow) -> str:
    return f"{r.ended_at - r.started_at:.3f}s" if r.started_at and r.ended_at else ""


def summary(view: RunView, *, all_rows: bool = False, every_row: bool = False) -> None:
    """The run's task table (per task, or per task name for big runs) and counts."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    # (emoji=False: a key or an error that holds ``:rocket:`` is shown as written)
    console = Console(width=max(100, min(160, Console(emoji=False).width)), soft_wrap=False,
                      emoji=False)
    rows = list(view.tasks.values())
    title = escape(f"run {view.run_id} ({view.pipeline}): {view.state}")
    table = Table(title=title, title_justify="left")
    listed = False      # (every row printed as plain lines: no table)
    if view.groups is not None:     # summed by the store: one line per task name
        for col in ("task", "tasks", "states", "cached", "busy time", "first error"):
            table.add_column(col, overflow="fold")
        for g in view.groups:
            _group_row(table, g)
    elif every_row and len(rows) > STATUS_ROWS:     # --all of a big run: plain columns
        console.print(title, soft_wrap=True)
        _plain_rows(view.in_order())
        listed = True
    elif every_row or len(rows) <= (STATUS_ROWS if all_rows else ROW_LIMIT):
        for col in ("task", "state", "attempts", "duration", "error"):
            table.add_column(col, overflow="fold")
        for r in view.in_order():       # each task after what it reads from
            state, err = _cells(r)
            # task keys hold [item] suffixes: escape them, or rich reads them as markup
            table.add_row(escape(r.key), f"[{_COLOURS.get(r.state, 'white')}]{state}[/]",
                          str(r.attempts), _duration(r), escape(err))
    else:   # many tasks: one line per task name
        for col in ("task", "tasks", "states", "cached", "busy time", "first error"):
            table.add_column(col, overflow="fold")
        by_name: dict[str, list[TaskRow]] = {}
        for r in rows:
            by_name.setdefault(r.task_name or r.key, []).append(r)
        for name, group in by_name.items():
            states: dict[str, int] = {}
            for r in group:
                states[r.state] = states.get(r.state, 0) + 1
            busy = sum(r.ended_at - r.started_at for r in group if r.started_at and r.ended_at)
            err = next((f"{r.key}: {r.error}" for r in group if r.error
                        and r.state != TaskState.SUCCEEDED), "")
            _group_row(table, TaskGroup(name, len(group), states,
                                        sum(1 for r in group if r.cached_from), busy, err))
    # no task yet (a submitted run, or one cancelled before a driver took it): no empty
    # table under a title wrapped to its width
    if not listed:
        console.print(table if rows or view.groups else title,
                      soft_wrap=not (rows or view.groups))
    console.print(f"tasks: {counts_text(view.counts()) or 'none'}")
    if view.groups is not None:
        first, failed = view.first_failure, view.counts().get(TaskState.FAILED.value, 0)
    else:
        causes = view.root_causes()
        first, failed = (causes[0] if causes else None), len(causes)
    if first is not None:
        more = f" (and {failed - 1} more)" if failed > 1 else ""
        # one line however long (a pipe or a log is read and grepped by line)
        console.print(f"root cause: {escape(first.key)}: {escape(first.error or 'failed')}"
                      f"{more}", markup=True, soft_wrap=True)
    if view.state == "waiting":
        console.print(f"waiting for approvals: pipeline approvals {view.run_id}")
    elif view.state == "submitted":
        console.print(f"waiting for a driver: pipeline resume {view.run_id}")
    elif view.active and view.driver_alive is False:
        console.print(f"driver is gone: resume with  pipeline resume {view.run_id}")


def _cells(r: TaskRow) -> tuple[str, str]:
    """A task row's state and error cells; a success shows no error (the one of a lost
    or failed try before it)."""
    state = r.state + (" (cached)" if r.cached_from else "")
    return state, "" if r.state == TaskState.SUCCEEDED else (r.error or "")[:120]


def _plain_rows(rows: list[TaskRow]) -> None:
    """Every task as a line of aligned columns (``status --all`` of a big run: rich
    lays a table out at ~0.6 ms a row, a minute for 100,000 tasks)."""
    keys = [r.key for r in rows]
    width = min(max(map(len, keys), default=4), 60)
    lines = [f"{'task':<{width}}  {'state':<28} {'attempts':>8} {'duration':>10}  error"]
    for r in rows:
        state, err = _cells(r)
        lines.append(f"{r.key:<{width}}  {state:<28} {r.attempts:>8} {_duration(r):>10}  "
                     f"{err}".rstrip())
    out("\n".join(lines))


def task_lines(row: TaskRow, attempts: list[dict[str, Any]]) -> list[str]:
    """``pipeline status --task``: the task's state, then each attempt with its
    outcome, duration, error and traceback."""
    cached = f" (cached from {row.cached_from})" if row.cached_from else ""
    lines = [f"task {row.key} ({row.task_name}): {row.state}{cached}, "
             f"{row.attempts} attempt(s)"]
    if row.error and row.state != TaskState.SUCCEEDED:
        lines.append(f"  error: {row.error}")
    for a in attempts:
        took = (f"{a['ended_at'] - a['started_at']:.3f}s"
                if a["started_at"] is not None and a["ended_at"] is not None else "-")
        if a["outcome"] == "lost" and took != "-":
            took = "<=" + took      # it ended when the driver died: known only as of the resume
        why = ": ".join(p for p in (a["error_type"], a["error_message"]) if p)
        err = f"  {why}" if a["outcome"] != "ok" and why else ""
        lines.append(f"  attempt {a['attempt']}: {a['outcome']:<9} {took:>9}{err}")
        if a.get("traceback"):
            lines += [f"      {line}" for line in a["traceback"].rstrip().splitlines()]
    return lines


def _group_row(table: Any, g: TaskGroup) -> None:
    from rich.markup import escape
    table.add_row(escape(g.name), str(g.count), ", ".join(
        f"[{_COLOURS.get(s, 'white')}]{n} {s}[/]" for s, n in sorted(g.states.items())),
        str(g.cached), f"{g.busy:.2f}s", escape(g.first_error[:120]))


def out(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Print a line (never captured as a task's output, even from a signal handler
    that interrupts a task); once the reader went away (``| head``), drop output."""
    from ..capture import real
    try:
        click.echo(text, nl=nl, file=real(sys.stderr if err else sys.stdout))
    except BrokenPipeError:
        import os
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, (sys.stderr if err else sys.stdout).fileno())
