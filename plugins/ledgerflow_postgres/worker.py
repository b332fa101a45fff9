"""``pipeline worker``: claim runs that wait for a driver in a PostgreSQL ledger and drive them.

A run waits for a driver when it was recorded by ``pipeline submit``
(``submitted``) or when its driver died (``running``/``cancelling`` with an
expired lease, or a holder on this host that is not alive). Workers on any number of machines claim them one at a time
with ``FOR UPDATE SKIP LOCKED`` (:meth:`PostgresStore.claim`: two workers
never claim the same run, and a claim takes a new fencing token), then
drive each with ``ledgerflow.resume`` on the executor given (``--executor
dask --dask-address ...`` spreads its tasks over a Dask cluster). Between
runs a worker waits for ``NOTIFY ledgerflow_runs`` (sent when a run is
submitted or a lease released, or on ``ledgerflow_signals``: an approval decided) or
``--poll`` seconds.

A run in state ``waiting`` (an approval gate no one decided yet) is not
claimed: a drive would find nothing to do. It is claimed again once a
decision on its open request is recorded (``signals``) or the request's
deadline passes (the drive then applies the deadline rule,
:func:`ledgerflow.gates.decide_deadline`). Among the claimable runs the
oldest goes first, so a waiting run never holds the newer ones back.

The pipeline is loaded from the target the run recorded (an absolute path
or a module name): it must exist on the worker's machine. A run whose
pipeline cannot be loaded is skipped by this worker (and left for others).
SIGINT/SIGTERM: stop claiming and finish the current run; a second one exits
at once (the run stays resumable; another worker takes it over once its
lease expires).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import click

import ledgerflow
from ledgerflow.cli.guard import guard
from ledgerflow.errors import InputError, LeaseLostError, NotResumableError, PipelineError

from .connection import StoreUnavailableError
from .lease import RUNS_CHANNEL, SIGNALS_CHANNEL, Claim

if TYPE_CHECKING:
    from .store import PostgresStore


def say(text: str) -> None:
    click.echo(text)
    sys.stdout.flush()


class Worker:
    """The claim-and-drive loop of one ``pipeline worker`` process."""

    def __init__(self, store: PostgresStore, *, executor: str | None = None,
                 workers: int | None = None, dask_address: str | None = None,
                 poll: float = 1.0, max_runs: int | None = None,
                 exit_idle: float | None = None) -> None:
        self.store = store
        self.executor = executor
        self.workers = workers
        self.dask_address = dask_address
        self.poll = poll
        self.max_runs = max_runs
        self.exit_idle = exit_idle
        self.stopping = threading.Event()
        self.skip: set[str] = set()
        self.driven: list[tuple[str, str]] = []
        self._listener: Any = None

    def serve(self) -> int:
        """Claim and drive runs until stopped; return how many were driven."""
        say(f"worker {os.getpid()} on {socket.gethostname()}: waiting for runs in "
            f"{self.store.db.shown}")
        idle_since = time.monotonic()
        while not self.stopping.is_set():
            try:
                claim = self.store.claim(self.skip)
            except StoreUnavailableError as exc:
                say(f"worker: {exc}; still waiting")
                self.stopping.wait(self.poll)
                continue
            if claim is None:
                if self.exit_idle is not None and \
                        time.monotonic() - idle_since >= self.exit_idle:
                    say(f"worker: nothing to do for {self.exit_idle:g}s; exiting")
                    break
                self._wait()
                continue
            self._drive(claim)
            idle_since = time.monotonic()
            if self.max_runs is not None and len(self.driven) >= self.max_runs:
                break
        with contextlib.suppress(Exception):
            if self._listener is not None:
                self._listener.close()
        return len(self.driven)

    def _wait(self) -> None:
        """Sleep until a run may be claimable (a NOTIFY of a run submitted or released,
        or of a decision; or ``poll`` seconds, which also finds passed deadlines)."""
        try:
            if self._listener is None:
                self._listener = self.store.db.connect()
                self._listener.execute(f"LISTEN {RUNS_CHANNEL}")
                self._listener.execute(f"LISTEN {SIGNALS_CHANNEL}")    # a decision
            for _ in self._listener.notifies(timeout=self.poll, stop_after=1):
                pass
        except Exception:
            with contextlib.suppress(Exception):
                if self._listener is not None:
                    self._listener.close()
            self._listener = None
            self.stopping.wait(self.poll)

    def _drive(self, claim: Claim) -> None:
        run_id, token = claim.lease.run_id, claim.lease.token
        say(f"worker: run {run_id} claimed (token {token}){claim.why()}")
        state = "interrupted"
        try:
            run = ledgerflow.resume(run_id, store=self.store, executor=self.executor,
                                    workers=self.workers, dask_address=self.dask_address)
            state = run.state
        except (NotResumableError, InputError) as exc:
            self.skip.add(run_id)
            say(f"worker: cannot drive run {run_id}: {exc} (skipped by this worker)")
        except LeaseLostError as exc:
            say(f"worker: run {run_id}: {exc}")
        except StoreUnavailableError as exc:
            say(f"worker: run {run_id}: {exc}; it stays resumable")
        except PipelineError as exc:
            say(f"worker: run {run_id} stopped: {exc}")
        finally:
            claimed = self.store._claimed.get(run_id)
            if claimed is not None:       # never taken over by resume (it failed first)
                self.store.release(claimed)
        self.driven.append((run_id, state))
        say(f"worker: run {run_id} ended {state}")


@click.command("worker")
@click.option("--store", envvar="LEDGERFLOW_STORE", required=True, metavar="URL",
              help="The ledger: a postgresql:// URL [env LEDGERFLOW_STORE].")
@click.option("--executor", envvar="LEDGERFLOW_EXECUTOR", metavar="NAME",
              help="Executor of the runs' tasks: threads (default), processes, dask... "
              "[env LEDGERFLOW_EXECUTOR].")
@click.option("--workers", envvar="LEDGERFLOW_WORKERS", type=click.IntRange(1),
              help="Tasks run at once per run [env LEDGERFLOW_WORKERS; default 4].")
@click.option("--dask-address", envvar="LEDGERFLOW_DASK_ADDRESS", metavar="URL",
              help="Dask scheduler for --executor dask [env LEDGERFLOW_DASK_ADDRESS].")
@click.option("--poll", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              envvar="LEDGERFLOW_WORKER_POLL",
              help="Seconds between looks for runs (besides notifications) "
              "[env LEDGERFLOW_WORKER_POLL].")
@click.option("--max-runs", type=click.IntRange(1), envvar="LEDGERFLOW_WORKER_MAX_RUNS",
              help="Exit after driving this many runs [env LEDGERFLOW_WORKER_MAX_RUNS].")
@click.option("--exit-idle", type=click.FloatRange(min=0), metavar="SECONDS",
              envvar="LEDGERFLOW_WORKER_EXIT_IDLE",
              help="Exit after this long with nothing to claim [env LEDGERFLOW_WORKER_EXIT_IDLE].")
@guard
def worker_command(store: str, executor: str | None, workers: int | None,
                   dask_address: str | None, poll: float, max_runs: int | None,
                   exit_idle: float | None) -> None:
    """Claim submitted or orphaned runs of a PostgreSQL ledger and drive them.

    \b
    Example:
      pipeline submit flows.py -p n=10 --store postgresql://db/ledger
      pipeline worker --store postgresql://db/ledger --executor dask \\
          --dask-address tcp://scheduler:8786
    """
    from ledgerflow.opening import check_executor, settings_for, store_for
    settings = settings_for(store)
    if settings.store_kind != "postgres":
        raise InputError(f"pipeline worker needs a PostgreSQL store, given: {store}",
                         hint="workers share a PostgreSQL ledger (--store "
                         "postgresql://HOST/DATABASE); a run in a file ledger is driven by "
                         "pipeline run, or pipeline resume RUN_ID --store PATH")
    check_executor(executor)
    st: Any = store_for(settings)
    w = Worker(st, executor=executor, workers=workers, dask_address=dask_address,
               poll=poll, max_runs=max_runs, exit_idle=exit_idle)
    presses = {"n": 0}

    def on_signal(signum: int, frame: Any) -> None:
        presses["n"] += 1
        if presses["n"] == 1:
            w.stopping.set()
            say("worker: stopping after the current run (again to exit at once; "
                "the run stays resumable)")
        else:
            os._exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        w.serve()
    finally:
        st.close()
