"""Tracebacks as a task's author reads them: from the first frame of their own code.

An attempt's traceback is recorded for ``pipeline logs`` and the console. The frames
above the task's own code (the executor, the attempt wrapper, a plugin's call into
the task) say nothing to its author, so they are dropped: the traceback starts at
the first frame outside ledgerflow's packages (``ledgerflow`` and ``ledgerflow_*``), as Python itself would show it had
the task been called directly. When every frame is ledgerflow's (an error raised by
the framework itself), the whole traceback is kept.
"""

from __future__ import annotations

import traceback
from types import TracebackType


def _framework(tb: TracebackType) -> bool:
    """True for a frame of ledgerflow's core or of a ``ledgerflow_*`` plugin package."""
    name = tb.tb_frame.f_globals.get("__name__") or ""
    return name == "ledgerflow" or name.startswith(("ledgerflow.", "ledgerflow_"))


def user_traceback(exc: BaseException, limit: int = 8000) -> str:
    """``exc`` formatted like ``traceback.format_exception``, its leading framework
    frames dropped, cut to the last ``limit`` characters."""
    tb = exc.__traceback__
    first = tb
    while first is not None and _framework(first):
        first = first.tb_next
    if first is not None and first is not tb:
        exc = exc.with_traceback(first)
    text = "".join(traceback.format_exception(exc))
    if tb is not None:
        exc.with_traceback(tb)          # the exception itself keeps its whole traceback
    return text[-limit:]
