"""Hook specifications: how plugins provide executors, stores, observers and commands.

Plugins are modules of ``@hookimpl`` functions registered through the
``ledgerflow`` entry-point group (the built-ins use the same path). A hook
implementation declares only the arguments it needs; hooks are called with
keyword arguments. Each spec below says when it is called, in which process,
and how results are combined. Observer hooks never break a run: what they
raise is logged and dropped (:mod:`ledgerflow.observers` calls them).

**The run protocol** (what ``Pipeline.run``, ``pipeline run``, ``resume`` and
``worker`` do, in order; "driver" is the process that drives the run, and
every hook below is called there, in the thread that drives it, except where
a step says otherwise):

1. ``ledgerflow_make_executor`` builds the executor and ``ledgerflow_make_store``
   opens the ledger; nothing is recorded yet, the graph is validated.
2. *Creation commit*: ``RunDefined``, ``DriverHeader`` and the run's
   ``running`` transition are committed with the lease (a resume instead
   commits the takeover: ``DriverHeader`` and ``running`` under a new fencing
   token, after the old driver's journal is folded). Then
   ``ledgerflow_records_committed`` sees those records.
3. ``ledgerflow_run_start(run_id, pipeline, resumed)``: after that commit,
   before any task is dispatched (in the thread that starts the drive).
4. The drive loop, one **group commit** after another. Records made since the
   last commit (tasks created, ``pending``/``ready``, cache hits with their
   results, approval requests and decisions, attempts moved to ``running``,
   and what ended attempts reported: ``AttemptEnded``, output, model and tool
   calls, steps, lineage, results) are appended to the ledger in one commit
   (the durability point: the journal is fsync'd). After it returned, in this
   order:

   a. ``ledgerflow_records_committed(records)`` with that commit's records;
   b. ``ledgerflow_task_state_changed`` for each task transition of the
      commit, in the order made, then the progress display;
   c. ``ledgerflow_attempt_finished`` for each attempt that ended in it;
   d. for each attempt whose ``running`` transition was in the commit,
      ``ledgerflow_job_carrier``, then the job goes to ``executor.submit``
      (or the runner calls the attempt itself, in the driver thread and with no
      Job: the ``inline`` executor, a lone task on ``threads``;
      :mod:`ledgerflow.here`). So no task code runs before its ``running`` is durable
      (*durable before start*), and a dependent starts only after the commit
      that holds its upstream's success and result (*durable before unlock*).
      One exception, the *commit lag* (``Settings.commit_lag``, 10 ms): on an
      executor that runs in the driver, in a run's first drive, an attempt of a
      task without side effects, retries, gate or timeout may start without
      this commit while the last one is younger than the lag; the records go
      out with the next commit (and the hooks of 4a-4c after it).

5. *In the worker* (a thread, process or cluster worker; no hook is called
   there): ``executor.call`` (what ``execute`` runs for a Job, and the
   runner for its own attempts) enters the carrier's ``scope()`` around the
   task call; ``context()`` appends steps, model and tool calls to the
   attempt logs (:mod:`ledgerflow.attempt_log`) as they happen. Whatever the
   task raises (``BaseException`` too) ends the attempt, never the worker
   or the driver. The attempt's ``Completion`` goes back to the driver,
   whose completion policy (:mod:`ledgerflow.outcomes`) turns it into
   records for the next commit (step 4).
6. *Last commit*: the run's final transition (``succeeded``, ``failed``,
   ``cancelled``, or ``waiting`` when only approval gates are open), with
   4a-4c after it. Then ``executor.shutdown``, the lease is released, and
   ``ledgerflow_run_finish(run_id, state)`` is called (``state`` is
   ``interrupted`` if the drive raised, e.g. the lease was lost).

**Approval hooks** (any process, not only the driver): a gate's request is
announced by ``ledgerflow_approval_requested`` in the driver when the gate asks
(once per request: a digest asked before is not announced again), and its
decision by ``ledgerflow_approval_decided`` in the process that recorded it
(``pipeline approve``/``reject``, ``Run.approve``, the console) or by
``ledgerflow_approval_expired`` in the first process that applied its deadline
(the driver, ``pipeline status``/``approvals``/``resume``, a worker, the
console): the store's atomic decision makes each fire once per request.

A cancel (Ctrl-C in the CLI, ``Run.cancel``, ``pipeline cancel`` from another
process) is seen by the loop within ~0.1 s: the run goes ``cancelling``, tasks
not started go ``cancelled`` and running ones ``cancelling`` in one commit,
and the executor is asked to stop them. The CLI turns Ctrl-C into that cancel
(a signal handler); a ``KeyboardInterrupt`` *raised inside a task* is the
task's, and only ends its attempt (step 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Sequence

    import click

    from .config import Settings
    from .executor import Carrier, Executor
    from .records import Record
    from .store import RunStore

hookspec = pluggy.HookspecMarker("ledgerflow")
hookimpl = pluggy.HookimplMarker("ledgerflow")


@hookspec(historic=True)
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add new hook specifications (e.g. an embedder or model registry).

    When: once per plugin, as it registers (historic: also for plugins that
    register later). Process: wherever the plugin manager is built. Use
    ``pluginmanager.add_hookspecs(module)``. Results: none.
    """


@hookspec
def ledgerflow_executor_names() -> list[str]:
    """Return the executor names this plugin can build.

    When: for listings (``pipeline plugins``) and error messages. Process: any.
    Results: every plugin's lists are combined.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_make_executor(name: str, settings: Settings) -> Executor | None:
    """Build the executor called ``name``, or return None if it is not yours.

    When: once per run and per resume, before anything is recorded. Process:
    the driver. Results: the first non-None result is used.
    """
    raise NotImplementedError


@hookspec
def ledgerflow_store_names() -> list[str]:
    """Return the store names this plugin can build.

    When: for listings and error messages. Process: any. Results: combined.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_make_store(name: str, settings: Settings) -> RunStore | None:
    """Build the run store called ``name``, or return None if it is not yours.

    ``settings.store`` is its location (a file for ``duckdb``). When: every
    time a command or a call opens the ledger. Process: any (drivers,
    readers, the console). Results: the first non-None result is used.
    """
    raise NotImplementedError


@hookspec
def ledgerflow_run_start(run_id: str, pipeline: str, resumed: bool) -> None:
    """A run (or a resume of it) starts driving.

    When: after the run's creation (or takeover) is committed, before any task
    is dispatched. Process: the driver, in the thread that starts the drive
    (the caller's, also when the run is then driven in a thread of its own).
    Results: none; exceptions are logged.
    """


@hookspec
def ledgerflow_task_state_changed(run_id: str, task_key: str, old: str | None, new: str,
                                  attempt: int, reason: str) -> None:
    """A task moved from ``old`` (None: it was just created) to ``new``.

    When: after the group commit that holds the transition returned, so an
    observer never reports what a crash could still lose; transitions of one
    commit arrive in the order they were made. Process: the driver, in the
    thread that drives the run: keep it cheap. Results: none; exceptions are
    logged and never break the run.
    """


@hookspec
def ledgerflow_attempt_finished(run_id: str, task_key: str, attempt: int, outcome: str,
                                started_at: float | None, ended_at: float | None,
                                error_type: str, error_message: str) -> None:
    """An attempt ended with ``outcome`` (ok, error, timeout, cancelled, lost).

    When: after the commit that holds the attempt's record (for a ``lost``
    attempt: when a resume records it). Process: the driver, in the thread
    that drives the run. Results: none; exceptions are logged.
    """


@hookspec
def ledgerflow_run_finish(run_id: str, state: str) -> None:
    """A run stopped driving: ``state`` is its final state, or ``interrupted``.

    When: after the run's last commit and the store's release. Process: the
    driver. Results: none; exceptions are logged.
    """


@hookspec
def ledgerflow_records_committed(run_id: str, records: Sequence[Record],
                                 store: RunStore) -> None:
    """The typed records of one commit of a run (:mod:`ledgerflow.records`), now durable.

    Every commit a driver makes reaches this hook, in commit order: the run's
    creation (``RunDefined`` first, before ``ledgerflow_run_start``), a
    takeover by a resume (``DriverHeader``, ``RunStateChanged``), and every
    group commit of the drive (transitions with their times, attempts,
    results with fingerprints and content hashes, lineage, notices), one
    record per table row: format 3's outcome records are told as the records
    they stand for (:func:`ledgerflow.records.expand`). An
    observer that needs what an earlier drive recorded reads it from
    ``store`` (the store being written; reads are safe, writes are not).
    When: right after the commit returned, before the attempts it started
    are handed to the executor. Process: the driver, in the thread that
    drives the run: keep it cheap (hand slow work to a thread of your own).
    Results: none; exceptions are logged. Runs with no implementation of
    this hook pay nothing for it. Added in 0.2.
    """


@hookspec
def ledgerflow_approval_requested(run_id: str, request: dict[str, Any]) -> None:
    """A gate asks a person: ``request`` is what the approver sees
    (:func:`ledgerflow.approval.request_doc`: task, action, arguments rendered and
    masked, digest, approvers, note, deadline).

    When: as the gate asks, in the loop turn whose group commit records it. Process:
    the driver, in the thread that drives the run: keep it cheap (hand slow work,
    e.g. a POST, to a thread). Results: none; exceptions are logged. Added in 0.3.
    """


@hookspec
def ledgerflow_approval_decided(run_id: str, decision: dict[str, Any]) -> None:
    """A person decided a request: ``decision`` has ``task_key``, ``digest``,
    ``decision`` (approved or rejected), ``decided_by``, ``reason``, ``decided_at``.

    When: right after the store recorded the decision (once: of two racing deciders
    only the winner's process calls it). Process: the one that decided (the CLI,
    ``Run.approve``/``reject``, the console). Results: none; exceptions are logged.
    Added in 0.3.
    """


@hookspec
def ledgerflow_approval_expired(run_id: str, decision: dict[str, Any]) -> None:
    """A request's deadline passed with no decision: ``decision`` as recorded
    (``expired``, or ``rejected`` with ``on_timeout="reject"``, by
    ``ledgerflow (deadline)``).

    When: right after the first process that applied the deadline recorded it (once).
    Process: that one (the driver, a reader such as ``pipeline status``, a worker, the
    console). Results: none; exceptions are logged. Added in 0.3.
    """


@hookspec(firstresult=True)
def ledgerflow_job_carrier(run_id: str, task_key: str, attempt: int) -> Carrier | None:
    """Return a :class:`~ledgerflow.executor.Carrier` for an attempt about to start, or None.

    The carrier travels with the attempt's :class:`~ledgerflow.executor.Job`
    to whatever process runs it (it is pickled with the job: define its
    class in an importable module), where its ``scope()`` is entered around
    the task call; its ``headers`` (e.g. W3C ``traceparent``) are
    ``context().carrier`` there, and program tasks get them as environment
    variables (``TRACEPARENT``). When: after the commit that holds the
    attempt's ``running`` transition (and after ``ledgerflow_records_committed``
    saw it), once per attempt. Process: the driver. Results: the first
    non-None result is used. Added in 0.2.
    """
    raise NotImplementedError


@hookspec
def ledgerflow_lineage_formats() -> list[str]:
    """Return the export formats of ``pipeline lineage --export FORMAT FILE`` you write.

    When: for listings and error messages. Process: any. Results: combined.
    Added in 0.2.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_export_lineage(format: str, run_id: str, store: RunStore,
                              path: str) -> int | None:
    """Write the lineage of run ``run_id`` as ``format`` to ``path``; None if not yours.

    ``path`` is a file to create or append to, or ``-`` for standard output.
    Return how many items (events, rows) were written. Raise a
    :class:`~ledgerflow.errors.PipelineError` for a run that cannot be
    exported (e.g. still running). When: ``pipeline lineage --export``.
    Process: the ``pipeline`` command. Results: the first non-None result.
    Added in 0.2.
    """
    raise NotImplementedError


@hookspec
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    """Add commands to the ``pipeline`` CLI group (``group.add_command(...)``).

    When: once, the first time the command line is parsed. Process: the
    ``pipeline`` command. Results: none; a PluginError is shown as a warning.
    """


@hookspec
def ledgerflow_spec_tasks() -> list[str]:
    """Return modules or packages whose ``@task`` functions declarative specs may name.

    When: when a catalogue of tasks is built (``pipeline spec-schema``,
    ``pipeline draft``; the tasks defined in plugin modules themselves are
    found without this hook). Process: the CLI. Results: every plugin's lists
    are combined. Added in 0.2.
    """
    raise NotImplementedError
