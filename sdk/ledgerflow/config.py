"""Settings: where the ledger lives and how runs execute.

Values come from keyword arguments, then ``LEDGERFLOW_*`` environment
variables, then defaults. No I/O beyond reading the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from .errors import ConfigError

DEFAULT_STORE = os.path.join(".ledgerflow", "ledger.duckdb")

#: Store locations that name a PostgreSQL database (the ``postgres`` store plugin).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
T = TypeVar("T", int, float)


def store_kind_for(location: str) -> str | None:
    """The store plugin a location implies (``postgres`` for a URL), or None."""
    if location.startswith(POSTGRES_SCHEMES):
        return "postgres"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How a run is executed and recorded.

    Example:
        >>> Settings.from_env(workers=2).workers
        2
    """

    store: str = DEFAULT_STORE
    store_kind: str = "duckdb"
    executor: str = "threads"
    workers: int = 4
    fail_fast: bool = False
    dask_address: str | None = None
    #: Echo what tasks write to stderr as it is written, prefixed with the task key.
    logs: bool = False
    #: Keep driving while approvals are pending (else the run stops ``waiting``).
    wait_approvals: bool = False
    #: Seconds an in-driver attempt (the ``inline`` executor) may start before the
    #: records of the attempts started since the last commit are written: one commit
    #: per lag instead of one per task. A crash re-runs, unseen, at most the attempts
    #: started within one lag (plus the one in flight). 0: every start is committed
    #: first. Never lagged: tasks with ``side_effects``, retries, a gate or a timeout,
    #: resumes, and executors outside the driver.
    commit_lag: float = 0.01
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.commit_lag >= 0:    # NaN too
            raise ConfigError(f"commit_lag must be 0 or more seconds, given: "
                              f"{self.commit_lag}", hint="use commit_lag=0 to commit "
                              "every start first, or the default 0.01")
        if self.workers < 1:
            raise ConfigError(f"workers must be at least 1, given: {self.workers}",
                              hint="pass --workers 1 or more")

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Build settings from ``LEDGERFLOW_*`` variables, then ``overrides``."""
        env = os.environ
        values: dict[str, object] = {}
        if env.get("LEDGERFLOW_STORE"):
            values["store"] = env["LEDGERFLOW_STORE"]
        if env.get("LEDGERFLOW_STORE_KIND"):
            values["store_kind"] = env["LEDGERFLOW_STORE_KIND"]
        if env.get("LEDGERFLOW_EXECUTOR"):
            values["executor"] = env["LEDGERFLOW_EXECUTOR"]
        if env.get("LEDGERFLOW_WORKERS"):
            values["workers"] = _positive_int("LEDGERFLOW_WORKERS", env["LEDGERFLOW_WORKERS"])
        if env.get("LEDGERFLOW_DASK_ADDRESS"):
            values["dask_address"] = env["LEDGERFLOW_DASK_ADDRESS"]
        if env.get("LEDGERFLOW_LOGS"):
            values["logs"] = env["LEDGERFLOW_LOGS"].lower() in ("1", "true", "yes", "on")
        if env.get("LEDGERFLOW_WAIT_APPROVALS"):
            values["wait_approvals"] = env["LEDGERFLOW_WAIT_APPROVALS"].lower() in (
                "1", "true", "yes", "on")
        if env.get("LEDGERFLOW_COMMIT_LAG"):
            values["commit_lag"] = _seconds("LEDGERFLOW_COMMIT_LAG", env["LEDGERFLOW_COMMIT_LAG"])
        if env.get("LEDGERFLOW_CANCEL_GRACE"):   # seconds to wait for a cancel to be confirmed
            values["options"] = {"cancel_grace": env["LEDGERFLOW_CANCEL_GRACE"]}
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "store_kind" not in values and isinstance(values.get("store"), str):
            kind = store_kind_for(values["store"])  # type: ignore[arg-type]
            if kind is not None:
                values["store_kind"] = kind
        settings = cls(**values)  # type: ignore[arg-type]
        if settings.store_kind == "duckdb" and settings.store == DEFAULT_STORE:
            settings = replace(settings, store=str(Path.cwd() / DEFAULT_STORE))
        return settings


def _seconds(name: str, raw: str) -> float:
    return _parsed(name, raw, float, "a number of seconds", "0.01")


def _positive_int(name: str, raw: str) -> int:
    return _parsed(name, raw, int, "a whole number", "4")


def _parsed(name: str, raw: str, kind: type[T], what: str, example: str) -> T:
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {what}, given: {raw!r}",
                          hint=f"set {name}={example} or unset it") from None
