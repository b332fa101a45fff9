"""What the ``processes`` executor's forkserver imports once: workers skip ``__main__``.

Imported only through the forkserver's preload list, so its one side effect
stays in that process: a child named ``ledgerflow-worker`` does not run the
driver's main script again (as spawn and forkserver children normally do to
unpickle objects of ``__main__``). Jobs ship ``__main__`` code by value with
cloudpickle, so nothing is lost, and a script without an
``if __name__ == "__main__":`` guard, or code read from stdin, still works
(its run is not started again in each worker). Other children of the same
forkserver keep the standard behaviour; on a Python without these private
hooks, so do the workers.
"""

from __future__ import annotations

import multiprocessing.process as _process
import multiprocessing.spawn as _spawn
from collections.abc import Callable
from typing import Any

WORKER_NAME = "ledgerflow-worker"


def _skip_for_workers(original: Callable[..., Any]) -> Callable[..., Any]:
    def fixup(*args: Any, **kwargs: Any) -> Any:
        if _process.current_process().name == WORKER_NAME:   # set from the launch data first
            return None
        return original(*args, **kwargs)
    fixup.__wrapped__ = original  # type: ignore[attr-defined]
    return fixup


for _name in ("_fixup_main_from_path", "_fixup_main_from_name"):
    _original = getattr(_spawn, _name, None)
    if _original is not None and not hasattr(_original, "__wrapped__"):
        setattr(_spawn, _name, _skip_for_workers(_original))
