"""The one definition of "current state": fold journal records into a RunView.

The memory store answers every read with :func:`apply`; the DuckDB store
applies it to the journal tail it has not folded yet; its SQL fold must give
the same rows, which the store contract suite checks
(``ledgerflow.testing.StoreContract``).
"""

from __future__ import annotations

from collections.abc import Iterable

from .records import (
    AttemptEnded,
    DriverHeader,
    Record,
    ResultRecorded,
    RunDefined,
    RunStateChanged,
    Succeeded,
    TaskCreated,
    Transition,
    dispatch_moves,
)
from .states import RUN_TERMINAL, TERMINAL, TaskState
from .views import RunView, TaskRow, error_text

_RUNNING = TaskState.RUNNING.value
_SUCCEEDED = TaskState.SUCCEEDED.value
_PENDING = TaskState.PENDING.value
_TERMINAL = frozenset(s.value for s in TERMINAL)
_RUN_TERMINAL = frozenset(s.value for s in RUN_TERMINAL)
_FAILED_WHY = frozenset({TaskState.FAILED.value, TaskState.UPSTREAM_FAILED.value})


def _row(view: RunView, key: str) -> TaskRow:
    row = view.tasks.get(key)
    if row is None:
        row = view.tasks[key] = TaskRow(key)
    return row


def _moved(view: RunView, row: TaskRow, seq: int, attempt: int, from_state: str | None,
           to: str, reason: str, ts: float) -> None:
    """Apply one task move to ``row``."""
    row.state = to
    if attempt > row.attempts:
        row.attempts = attempt
    if to == _RUNNING and row.started_at is None:
        row.started_at = ts
    if to == _PENDING and from_state is not None:       # a resume reset
        row.budget_base = attempt
        row.ended_at = row.started_at = None            # timed afresh
    elif to in _TERMINAL:
        row.ended_at = ts
        if to in _FAILED_WHY and row.error is None:    # no attempt said why
            row.error = reason or None
    if seq > view.max_seq:
        view.max_seq = seq


def _ended(row: TaskRow, attempt: int, error: str | None) -> None:
    """Apply the end of attempt ``attempt`` (``error``: the row's error text after it)."""
    if attempt > row.attempts:
        row.attempts = attempt
    row.error = error


def _result(row: TaskRow, r: ResultRecorded | Succeeded, cached_from: str | None) -> None:
    row.fingerprint, row.result_hash, row.result_kind = r.fingerprint, r.content_hash, r.kind
    row.result_data, row.result_uri, row.result_size = r.data, r.uri, r.size
    row.cached_from, row.result_attempt = cached_from, r.attempt


def apply(view: RunView, records: Iterable[Record]) -> RunView:
    """Fold ``records`` into ``view`` (in place) and return it.

    Format 3's outcome records are applied as the records they stand for
    (:func:`ledgerflow.records.expand`).

    Example:
        >>> from ledgerflow.records import Transition
        >>> v = apply(RunView("r"), [Transition(1, "a", 0, None, "pending", "", 1.0)])
        >>> v.tasks["a"].state
        'pending'
    """
    for rec in records:
        t = type(rec)
        if t is Transition:
            e: Transition = rec  # type: ignore[assignment]
            row = _row(view, e.task_key)
            _moved(view, row, e.seq, e.attempt, e.from_state, e.to_state, e.reason, e.ts)
            if e.then_state is not None:
                _moved(view, row, e.seq + 1, e.then_attempt, e.to_state, e.then_state,
                       e.then_reason, e.then_ts)
        elif t is Succeeded:
            s: Succeeded = rec  # type: ignore[assignment]
            row = _row(view, s.task_key)
            if s.run_ts is not None:        # format 4: its dispatch too
                for m in dispatch_moves(s):
                    _moved(view, row, m.seq, m.attempt, m.from_state, m.to_state, m.reason,
                           m.ts)
            _ended(row, s.attempt, None)        # an ok attempt: no error text
            _result(row, s, None)
            _moved(view, row, s.seq, s.attempt, _RUNNING, _SUCCEEDED, "", s.ts)
        elif t is TaskCreated:
            c: TaskCreated = rec  # type: ignore[assignment]
            row = _row(view, c.task_key)
            row.task_name, row.node, row.item_key = c.task_name, c.node, c.item_key
            row.position, row.upstream, row.code_version = (
                c.position, list(c.upstream), c.code_version)
            if c.seq:
                _moved(view, row, c.seq, 0, None, _PENDING, "", c.at)
                if c.then_state is not None:
                    _moved(view, row, c.seq + 1, c.then_attempt, _PENDING, c.then_state,
                           c.then_reason, c.then_ts)
        elif t is AttemptEnded:
            a: AttemptEnded = rec  # type: ignore[assignment]
            _ended(_row(view, a.task_key), a.attempt,
                   error_text(a.outcome, a.error_type, a.error_message))
        elif t is ResultRecorded:
            r: ResultRecorded = rec  # type: ignore[assignment]
            _result(_row(view, r.task_key), r, r.cached_from)
        elif t is RunStateChanged:
            st: RunStateChanged = rec  # type: ignore[assignment]
            view.state, view.reason = st.state, st.reason
            view.ended_at = st.at if st.state in _RUN_TERMINAL else None
        elif t is RunDefined:
            d: RunDefined = rec  # type: ignore[assignment]
            view.run_id, view.pipeline, view.target = d.run_id, d.pipeline, d.target
            view.params, view.created_at, view.options = d.params, d.created_at, d.options
        elif t is DriverHeader:
            h: DriverHeader = rec  # type: ignore[assignment]
            view.token = max(view.token, h.token)
            view.driver_pid, view.driver_host = h.pid, h.host
    return view
