"""Per-key limits: requests and tokens per minute, calls at once, and a provider's Retry-After.

Every call through a key alias (the environment variable naming the API key)
first takes a slot in that key's limiter and gives it back after. The state
of a key is one small JSON file in the ledger's folder
(``LEDGER.d/agents/keys/<key>.limits.json``) under an exclusive ``flock``, so
the threads and the processes of a driver, and other drivers of the same
ledger on this machine, share it:

* a sliding window of the last 60 s of requests (each with its tokens, the
  worst case at first, settled to the real count after);
* the calls in flight (a dead process's slot is taken back);
* ``blocked_until``: after a 429 with ``Retry-After``, every caller of that key
  waits until then, not only the one that got it.

A caller that must wait sleeps outside the lock (at most 1 s at a time,
checking for cancellation) until its request fits, or fails after
``max_wait`` seconds with a retryable :class:`~ledgerflow_agents.RateLimited`.
Other machines have their own files: the limits hold per machine (give each
machine its share of the provider's limit), unless a store provides shared
state. Without folders (the memory store) the state lives in this process.

Why not pyrate-limiter: its buckets count requests (or weights) per window,
but a key also needs concurrency slots taken back from dead processes,
tokens settled after the call, and a shared Retry-After; all three fit in
the same locked state, at about 0.2 ms per call (measured in
``tests/perf/bench_agents.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerflow.errors import DefinitionError

from ._canonical import digest
from .budget import Owner
from .errors import BudgetExceeded, RateLimited

__all__ = ["KeyLimiter", "KeyLimits", "limiter_for"]

WINDOW = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyLimits:
    """Limits of one key alias (each optional, positive).

    Args:
        requests_per_minute: requests started in any 60 s.
        tokens_per_minute: tokens (worst case until settled) in any 60 s.
        concurrent: calls in flight at once.
        max_wait: seconds a call may wait for its turn before failing
            (retryably) with RateLimited.

    Example:
        >>> KeyLimits(requests_per_minute=60, concurrent=4).concurrent
        4
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent: int | None = None
    max_wait: float = 300.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "concurrent"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise DefinitionError(f"{name} must be a positive whole number, given: {v!r}",
                                      hint=f"e.g. KeyLimits({name}=10), or leave it out")
        if not self.max_wait > 0:
            raise DefinitionError(f"max_wait must be positive, given: {self.max_wait!r}",
                                  hint="e.g. KeyLimits(max_wait=60)")


def _blank() -> dict[str, Any]:
    return {"window": [], "slots": {}, "blocked_until": 0.0}


class KeyLimiter:
    """The shared limiter state of one key alias (see the module doc)."""

    def __init__(self, alias: str, folder: str | None) -> None:
        self.alias = alias
        name = digest(alias)[7:31]
        self.path = None if folder is None else \
            Path(folder) / "agents" / "keys" / f"{name}.limits.json"
        self._thread_lock = threading.Lock()
        self._memory = _blank()

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with self._thread_lock:
            if self.path is None:
                yield self._memory
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    fh.seek(0)
                    text = fh.read()
                    state = json.loads(text) if text.strip() else _blank()
                    before = json.dumps(state, sort_keys=True)
                    yield state
                    after = json.dumps(state, sort_keys=True)
                    if after != before:
                        fh.seek(0)
                        fh.truncate()
                        fh.write(after)
                        fh.flush()
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)

    def _wait_needed(self, state: dict[str, Any], limits: KeyLimits, tokens: int,
                     now: float) -> float:
        """Seconds until a request of ``tokens`` fits (0: it fits now)."""
        state["window"] = [w for w in state["window"] if w[0] > now - WINDOW]
        for sid, s in list(state["slots"].items()):
            if not Owner(*s).alive():
                del state["slots"][sid]
        wait = max(0.0, float(state.get("blocked_until", 0.0)) - now)
        window = state["window"]
        rpm = limits.requests_per_minute
        if rpm is not None and len(window) >= rpm:
            wait = max(wait, window[len(window) - rpm][0] + WINDOW - now)
        tpm = limits.tokens_per_minute
        if tpm is not None:
            used = sum(w[1] for w in window)
            if used + tokens > tpm:
                freed, until = used, now
                for w in window:
                    freed -= w[1]
                    until = w[0] + WINDOW
                    if freed + tokens <= tpm:
                        break
                wait = max(wait, until - now)
        if wait == 0.0 and limits.concurrent is not None \
                and len(state["slots"]) >= limits.concurrent:
            wait = 0.05         # poll: a slot frees when a call ends
        return wait

    def acquire(self, sid: str, tokens: int, limits: KeyLimits, *,
                cancelled: Callable[[], bool] | None = None,
                sleep: Callable[[float], None] = time.sleep) -> float:
        """Take a slot for a request of ``tokens`` (worst case); return seconds waited.

        Raises:
            BudgetExceeded: the request alone exceeds ``tokens_per_minute``.
            RateLimited: no turn within ``limits.max_wait`` seconds (retryable).
        """
        if limits.tokens_per_minute is not None and tokens > limits.tokens_per_minute:
            raise BudgetExceeded(f"a request of up to {tokens} tokens can never fit key "
                                 f"{self.alias}'s {limits.tokens_per_minute} tokens per minute")
        started = time.monotonic()
        owner = Owner.me()
        while True:
            now = time.time()
            with self._state() as state:
                wait = self._wait_needed(state, limits, tokens, now)
                if wait == 0.0:
                    state["window"].append([now, tokens, sid])
                    state["slots"][sid] = [owner.host, owner.pid, owner.started]
                    return time.monotonic() - started
            waited = time.monotonic() - started
            if waited + wait > limits.max_wait:
                raise RateLimited(f"key {self.alias}: no turn within {limits.max_wait:g}s "
                                  "(its requests, tokens or concurrent calls are at their "
                                  "limits)", retry_after=wait,
                                  hint="raise the key's limits, or lower the workers")
            if cancelled is not None and cancelled():
                from ledgerflow.context import TaskCancelled
                raise TaskCancelled(self.alias)
            sleep(min(max(wait, 0.01), 1.0))

    def release(self, sid: str, tokens: int | None) -> None:
        """Give the slot back; settle the request's tokens to ``tokens`` (None: keep)."""
        with self._state() as state:
            state["slots"].pop(sid, None)
            if tokens is not None:
                for w in state["window"]:
                    if w[2] == sid:
                        w[1] = tokens
                        break

    def block(self, seconds: float) -> None:
        """Make every caller of this key wait ``seconds`` (a provider's Retry-After)."""
        with self._state() as state:
            state["blocked_until"] = max(float(state.get("blocked_until", 0.0)),
                                         time.time() + seconds)

    def snapshot(self) -> dict[str, Any]:
        """The current state (window, slots, blocked_until), for tests and status."""
        with self._state() as state:
            copy: dict[str, Any] = json.loads(json.dumps(state))
        return copy


_lock = threading.Lock()
_limiters: dict[tuple[str, str | None], KeyLimiter] = {}


def limiter_for(alias: str, ledger_folder: str | None) -> KeyLimiter:
    """The limiter of key ``alias`` for a ledger folder (one object per process)."""
    key = (alias, ledger_folder)
    with _lock:
        found = _limiters.get(key)
        if found is None:
            found = _limiters[key] = KeyLimiter(alias, ledger_folder)
        return found
