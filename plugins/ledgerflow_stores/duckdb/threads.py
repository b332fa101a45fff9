"""Threads this process runs for a ledger's runs after their release (a fold, an
archiving), by ledger and run: started as they are listed, waited for by either.

They are not daemons, so the interpreter's exit waits for them too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class RunThreads:
    """One kind of work a thread does per (ledger, run) in this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._threads: dict[tuple[str, str], threading.Thread] = {}
        self._guard = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._threads)

    def start(self, where: str, run_id: str, work: Callable[[], None]) -> None:
        """``work`` on a thread of its own, once the one before it of this run ended."""
        self.wait(where, run_id)
        thread = threading.Thread(target=work, name=f"ledgerflow-{self.name}-{run_id}")
        with self._guard:       # (started as it is listed: a wait joins it at once)
            self._threads[(where, run_id)] = thread
            thread.start()

    def running(self, where: str) -> set[str]:
        """The runs of ``where`` whose thread is still at work."""
        with self._guard:
            return {r for (w, r), t in self._threads.items() if w == where and t.is_alive()}

    def wait(self, where: str, run_id: str | None = None) -> None:
        """Wait for the threads of ``where`` (of ``run_id``, or of every run); from one of
        those threads, not for itself."""
        me = threading.current_thread()
        with self._guard:
            keys = [k for k in self._threads if k[0] == where and run_id in (None, k[1])]
        for key in keys:
            with self._guard:
                thread = self._threads.get(key)
            if thread is None or thread is me:
                continue
            thread.join()
            with self._guard:
                if self._threads.get(key) is thread:
                    del self._threads[key]
