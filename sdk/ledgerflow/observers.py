"""Who hears of a run's moves: the observer hooks and a progress display, in one object.

The runner and the launch layer tell an :class:`Observers` what happened
(after the commit that holds it, see :mod:`ledgerflow.hookspecs`); it calls
the plugin hooks and the progress display. **Observers must never break a
run**: that rule is written once, in :func:`_safe` — what an observer raises
is logged and dropped. A hook nobody implements is not kept, so a run with
no observer pays nothing on its hot path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .records import expand

if TYPE_CHECKING:
    import pluggy

    from .executor import Carrier
    from .records import AttemptEnded, Record
    from .store import RunStore

log = logging.getLogger("ledgerflow")

#: One task transition as observers hear of it: (run_id, task_key, old, new, attempt, reason).
Change = tuple[str, str, "str | None", str, int, str]


@runtime_checkable
class Progress(Protocol):
    """A progress display (``progress=`` of :meth:`Pipeline.run`, the CLI's bar).

    It is called with ``(task_key, old, new)`` after each committed transition;
    ``begin(counts)`` is called once first when a resume starts from the
    counts the run had. A plain callable is a progress display without ``begin``.
    """

    def __call__(self, key: str, old: str, new: str) -> None: ...

    def begin(self, counts: Mapping[str, int]) -> None: ...


def _safe(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call an observer; what it raises is logged and dropped (it must never break a run)."""
    try:
        return fn(*args, **kwargs)
    except Exception:
        log.exception("%s failed", what)
        return None


class Observers:
    """The observers of one run. Each attribute is None when nobody listens."""

    __slots__ = ("carrier_hook", "changed_hook", "ended_hook", "finish_hook", "progress",
                 "records", "start_hook", "watching")

    def __init__(self, *, changed: Callable[..., Any] | None = None,
                 ended: Callable[..., Any] | None = None,
                 records: Callable[..., Any] | None = None,
                 carrier: Callable[..., Any] | None = None,
                 run_start: Callable[..., Any] | None = None,
                 run_finish: Callable[..., Any] | None = None,
                 progress: Callable[[str, str, str], None] | None = None) -> None:
        self.changed_hook = changed
        self.ended_hook = ended
        self.records = records
        self.carrier_hook = carrier
        self.start_hook = run_start
        self.finish_hook = run_finish
        self.progress = progress
        #: True if transitions are heard at all (the runner queues them only then).
        self.watching = changed is not None or progress is not None

    @classmethod
    def from_plugins(cls, pm: pluggy.PluginManager | None = None,
                     progress: Callable[[str, str, str], None] | None = None) -> Observers:
        """The hooks of the registered plugins that someone implements, and ``progress``."""
        if pm is None:
            from .plugins import get_plugin_manager
            pm = get_plugin_manager()
        h = pm.hook

        def kept(hook: Any) -> Any:
            return hook if hook.get_hookimpls() else None
        return cls(changed=kept(h.ledgerflow_task_state_changed),
                   ended=kept(h.ledgerflow_attempt_finished),
                   records=kept(h.ledgerflow_records_committed),
                   carrier=kept(h.ledgerflow_job_carrier),
                   # looked up when called (a plugin may register meanwhile)
                   run_start=h.ledgerflow_run_start, run_finish=h.ledgerflow_run_finish,
                   progress=progress)

    @property
    def hears_attempts(self) -> bool:
        """True if someone wants :meth:`ended` calls."""
        return self.ended_hook is not None

    def begin(self, counts: Mapping[str, int]) -> None:
        """A resume starts: the progress display starts from the run's counts."""
        if isinstance(self.progress, Progress):
            _safe("progress display", self.progress.begin, counts)

    def run_start(self, run_id: str, pipeline: str, resumed: bool) -> None:
        if self.start_hook is not None:
            _safe("ledgerflow_run_start hook", self.start_hook, run_id=run_id,
                  pipeline=pipeline, resumed=resumed)

    def run_finish(self, run_id: str, state: str) -> None:
        if self.finish_hook is not None:
            _safe("ledgerflow_run_finish hook", self.finish_hook, run_id=run_id, state=state)

    def committed(self, run_id: str, records: Sequence[Record], store: RunStore) -> None:
        if self.records is not None:     # told as one record a row (format 2's shape)
            _safe("ledgerflow_records_committed hook", self.records, run_id=run_id,
                  records=expand(records), store=store)

    def changed(self, changes: Sequence[Change]) -> None:
        hook, progress = self.changed_hook, self.progress
        for run_id, key, old, new, attempt, reason in changes:
            if hook is not None:
                _safe("ledgerflow_task_state_changed hook", hook, run_id=run_id,
                      task_key=key, old=old, new=new, attempt=attempt, reason=reason)
            if progress is not None:
                _safe("progress display", progress, key, old or "", new)

    def ended(self, run_id: str, attempts: Sequence[AttemptEnded]) -> None:
        if self.ended_hook is None:
            return
        for a in attempts:
            _safe("ledgerflow_attempt_finished hook", self.ended_hook, run_id=run_id,
                  task_key=a.task_key, attempt=a.attempt, outcome=a.outcome,
                  started_at=a.started_at, ended_at=a.ended_at, error_type=a.error_type,
                  error_message=a.error_message)

    def carrier(self, run_id: str, task_key: str, attempt: int) -> Carrier | None:
        """What an observer attaches to an attempt about to start (or None)."""
        if self.carrier_hook is None:
            return None
        result: Carrier | None = _safe("ledgerflow_job_carrier hook", self.carrier_hook,
                                       run_id=run_id, task_key=task_key, attempt=attempt)
        return result
