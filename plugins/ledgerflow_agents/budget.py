"""Budgets reserved before the spend: the task's, the run's and the key's, settled after.

Before each model call (and each tool call) the worst case is **reserved** in
every budget that applies: the estimated input tokens plus ``max_output_tokens``,
times the model's price when it has one, one model call (or tool call). A
reservation that does not fit raises :class:`BudgetExceeded` (not retried;
nothing was spent). After the call the reservation is **settled** to what the
provider reports (a failed call keeps its reported usage, or the whole
reservation when the usage is unknown). As reserve-check-add is one step
under one lock, concurrent calls cannot overshoot a budget together; only a
provider that bills more than its reservation (it ignored ``max_tokens``,
or the input estimate was low) can, by that excess, and then the task fails
with ``BudgetExceeded`` and a notice.

Where budgets live (:class:`FileBudgetLedger`):

* the run's and its tasks' budgets in the run's folder (``RUN.d/budgets/``),
* a key's budget in the ledger's folder (``LEDGER.d/agents/keys/``), for every
  run of that ledger,
* one lock (``LEDGER.d/agents/budget.lock``, ``fcntl.flock``) around each
  reservation and settlement, so threads and processes of one machine share
  them. On another machine the files are others: budgets hold per machine
  unless the store provides a shared ledger (see :class:`BudgetLedger`).

A reservation made by a process that died (same host, pid gone) is counted as
spent in full when another reservation looks at its budget, and settled to
the real usage if the task later replays the call's recorded response.
Without folders (the memory store) the ledger lives in this process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ledgerflow.errors import DefinitionError
from ledgerflow.procs import pid_alive, proc_start

from ._canonical import digest
from .errors import BudgetExceeded

__all__ = ["DIMENSIONS", "Amount", "Budget", "BudgetLedger", "FileBudgetLedger",
           "MemoryBudgetLedger", "Owner", "Scope", "ledger_for"]

#: What a budget limits, in the order they are reported.
DIMENSIONS = ("tokens", "usd", "model_calls", "tool_calls")


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Limits on tokens, dollars, model calls and tool calls (each optional, positive).

    Example:
        >>> Budget(tokens=20_000, usd=0.50, tool_calls=10).tokens
        20000

    Raises:
        DefinitionError: a limit that is not positive, or no limit at all.
    """

    tokens: int | None = None
    usd: float | None = None
    model_calls: int | None = None
    tool_calls: int | None = None

    def __post_init__(self) -> None:
        given = {k: getattr(self, k) for k in DIMENSIONS if getattr(self, k) is not None}
        if not given:
            raise DefinitionError("a Budget needs at least one limit",
                                  hint="e.g. Budget(tokens=20000) or Budget(usd=0.5)")
        for name, value in given.items():
            whole = name != "usd"
            bad = isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (whole and not float(value).is_integer()) or not math.isfinite(value) or \
                value <= 0
            if bad:
                raise DefinitionError(f"budget {name} must be a positive "
                                      f"{'whole number' if whole else 'number'}, given: "
                                      f"{value!r}", hint=f"e.g. Budget({name}="
                                      f"{'1000' if whole else '0.5'})")

    def limits(self) -> dict[str, float]:
        """The limits given, by dimension."""
        return {k: float(getattr(self, k)) for k in DIMENSIONS if getattr(self, k) is not None}


@dataclass(frozen=True, slots=True)
class Amount:
    """What a call reserves or spends."""

    tokens: int = 0
    usd: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0

    def __post_init__(self) -> None:
        # a spend is never negative: a negative one would credit every budget it settles
        for k in DIMENSIONS:
            value = getattr(self, k)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"a budget amount is never negative or infinite: {k}={value!r}")

    def as_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in DIMENSIONS}

    @classmethod
    def of(cls, data: Mapping[str, float]) -> Amount:
        return cls(int(data.get("tokens", 0)), float(data.get("usd", 0.0)),
                   int(data.get("model_calls", 0)), int(data.get("tool_calls", 0)))


@dataclass(frozen=True, slots=True)
class Scope:
    """One budget a call counts against: ``kind`` task, run or key, and its id."""

    kind: str
    id: str
    budget: Budget

    @property
    def name(self) -> str:
        return f"{self.kind} {self.id}"


@dataclass(frozen=True, slots=True)
class Owner:
    """The process holding a reservation (to tell a live one from a dead one)."""

    host: str
    pid: int
    started: str

    @classmethod
    def me(cls) -> Owner:
        """This process."""
        pid = os.getpid()
        found = _ME.get(pid)
        if found is None:
            found = _ME[pid] = cls(socket.gethostname(), pid, proc_start(pid) or "?")
        return found

    def alive(self) -> bool:
        """False only when sure: same host and that process is gone (or another one)."""
        if self.host != socket.gethostname():
            return True
        known = None if self.started == "?" else self.started     # "?": start unknown
        return self.started != "" and pid_alive(self.pid, known)


_ME: dict[int, Owner] = {}


class BudgetLedger(Protocol):
    """Where reservations and spend are kept; a store may provide one shared by machines.

    A store-backed ledger (PostgreSQL) needs: one row per scope with its
    spent amounts, one row per open reservation (scope, id, amount, owner,
    lease expiry), and a reserve that checks ``spent + reserved + amount <=
    limit`` for every scope and inserts the reservations in one transaction
    (``SELECT ... FOR UPDATE`` on the scope rows, locked in name order);
    settle deletes the reservation and adds the actual amount in one
    transaction, idempotently (a settled id is a no-op); reservations whose
    owner's lease expired count as spent.
    """

    def reserve(self, rid: str, scopes: Sequence[Scope], amount: Amount,
                owner: Owner) -> None:
        """Reserve ``amount`` in every scope, or none (raises BudgetExceeded)."""
        ...

    def settle(self, rid: str, scopes: Sequence[Scope], actual: Amount) -> list[str]:
        """Replace the reservation ``rid`` by ``actual``; return what is now over its
        limit (empty when all fit). Settling twice does nothing the second time."""
        ...

    def usage(self, scope: Scope) -> dict[str, Any]:
        """``{"spent": {...}, "reserved": {...}, "limit": {...}}`` of one scope."""
        ...


def _blank() -> dict[str, Any]:
    return {"spent": {k: 0.0 for k in DIMENSIONS}, "reserved": {}, "orphaned": {},
            "limit": {}}


def _reserved_total(state: Mapping[str, Any]) -> dict[str, float]:
    out = {k: 0.0 for k in DIMENSIONS}
    for r in state["reserved"].values():
        for k in DIMENSIONS:
            out[k] += float(r["amount"].get(k, 0.0))
    return out


def _fmt(dim: str, value: float) -> str:
    return f"${value:.4f}" if dim == "usd" else f"{int(value)} {dim.replace('_', ' ')}"


class _Ledger:
    """The reservation logic; subclasses say where the states live and what locks them."""

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def _load(self, scope: Scope) -> dict[str, Any]:
        raise NotImplementedError

    def _save(self, scope: Scope, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _reclaim(self, state: dict[str, Any]) -> bool:
        """Count reservations of dead processes as spent in full (kept as orphaned)."""
        changed = False
        for rid, r in list(state["reserved"].items()):
            if not Owner(*r["owner"]).alive():
                del state["reserved"][rid]
                state["orphaned"][rid] = r["amount"]
                for k in DIMENSIONS:
                    state["spent"][k] += float(r["amount"].get(k, 0.0))
                changed = True
        return changed

    def reserve(self, rid: str, scopes: Sequence[Scope], amount: Amount,
                owner: Owner) -> None:
        need = amount.as_dict()
        with self._lock():
            states = []
            for scope in scopes:
                state = self._load(scope)
                if self._reclaim(state):
                    self._save(scope, state)
                state["limit"] = scope.budget.limits()
                held = _reserved_total(state)
                for dim, limit in state["limit"].items():
                    used = state["spent"][dim] + held[dim]
                    if need[dim] and used + need[dim] > limit + 1e-12:
                        raise BudgetExceeded(
                            f"the {scope.name} budget does not fit the next call: "
                            f"{_fmt(dim, used)} of {_fmt(dim, limit)} spent or reserved, "
                            f"and this call needs up to {_fmt(dim, need[dim])}")
                states.append(state)
            entry = {"amount": need, "owner": [owner.host, owner.pid, owner.started],
                     "at": time.time()}
            for scope, state in zip(scopes, states, strict=True):
                state["reserved"][rid] = entry
                self._save(scope, state)

    def settle(self, rid: str, scopes: Sequence[Scope], actual: Amount) -> list[str]:
        spend = actual.as_dict()
        over = []
        with self._lock():
            for scope in scopes:
                state = self._load(scope)
                if rid in state["reserved"]:
                    del state["reserved"][rid]
                    delta = spend
                elif rid in state["orphaned"]:
                    was = state["orphaned"].pop(rid)
                    delta = {k: spend[k] - float(was.get(k, 0.0)) for k in DIMENSIONS}
                else:
                    continue            # settled already
                for k in DIMENSIONS:
                    state["spent"][k] += delta[k]
                self._save(scope, state)
                for dim, limit in scope.budget.limits().items():
                    if state["spent"][dim] > limit + 1e-12:
                        over.append(f"the {scope.name} budget: {_fmt(dim, state['spent'][dim])}"
                                    f" spent of {_fmt(dim, limit)}")
        return over

    def usage(self, scope: Scope) -> dict[str, Any]:
        with self._lock():
            state = self._load(scope)
        return {"spent": dict(state["spent"]), "reserved": _reserved_total(state),
                "limit": dict(state["limit"]), "open": len(state["reserved"])}


class FileBudgetLedger(_Ledger):
    """Budgets in files next to the ledger, under one ``flock`` (see the module doc).

    Args:
        ledger_folder: the ledger's folder (key budgets, the lock).
        run_folder: the run's folder (run and task budgets).
    """

    def __init__(self, ledger_folder: str, run_folder: str) -> None:
        self.ledger_folder = Path(ledger_folder)
        self.run_folder = Path(run_folder)
        self.lock_path = self.ledger_folder / "agents" / "budget.lock"
        self._thread_lock = threading.Lock()

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with self._thread_lock, open(self.lock_path, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def path(self, scope: Scope) -> Path:
        """The file holding ``scope``'s budget."""
        name = digest(scope.id)[7:31]
        if scope.kind == "key":
            return self.ledger_folder / "agents" / "keys" / f"{name}.budget.json"
        return self.run_folder / "budgets" / f"{scope.kind}-{name}.json"

    def _load(self, scope: Scope) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path(scope).read_text())
        except FileNotFoundError:
            return _blank()
        data.setdefault("orphaned", {})
        return data

    def _save(self, scope: Scope, state: dict[str, Any]) -> None:
        path = self.path(scope)
        path.parent.mkdir(parents=True, exist_ok=True)
        state["scope"] = scope.name
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            json.dump(state, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


class MemoryBudgetLedger(_Ledger):
    """Budgets in this process only (stores without folders)."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}
        self._thread_lock = threading.RLock()

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return self._thread_lock  # type: ignore[return-value]

    def _load(self, scope: Scope) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(json.dumps(
            self._states.get(f"{scope.kind}:{scope.id}") or _blank()))
        return state

    def _save(self, scope: Scope, state: dict[str, Any]) -> None:
        self._states[f"{scope.kind}:{scope.id}"] = state


@dataclass(slots=True)
class _Ledgers:
    lock: threading.Lock = field(default_factory=threading.Lock)
    by_folder: dict[tuple[str, str], _Ledger] = field(default_factory=dict)
    memory: MemoryBudgetLedger = field(default_factory=MemoryBudgetLedger)


_LEDGERS = _Ledgers()


def ledger_for(ledger_folder: str | None, run_folder: str | None) -> BudgetLedger:
    """The budget ledger for a task with these folders (``context()``'s)."""
    if not ledger_folder or not run_folder:
        return _LEDGERS.memory
    key = (ledger_folder, run_folder)
    with _LEDGERS.lock:
        found = _LEDGERS.by_folder.get(key)
        if found is None:
            found = _LEDGERS.by_folder[key] = FileBudgetLedger(ledger_folder, run_folder)
        return found
