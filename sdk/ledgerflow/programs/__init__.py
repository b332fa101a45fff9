"""Program tasks: run a command as a task, and stop its whole process tree.

``program(name, argv=[...])`` returns a :class:`ProgramTask`, used in a
pipeline like any task (``.map``, retries, caching). How an attempt runs:

* **No shell.** argv is executed directly. Keyword arguments of the call
  reach the program as ``{name}`` placeholders, each replaced inside its one
  argv element (never re-split), and as ``LEDGERFLOW_PARAM_<NAME>``
  environment variables. ``shell=True`` runs one command string with
  ``/bin/sh -c`` and fills no placeholders (use ``"$LEDGERFLOW_PARAM_X"``).
  A placeholder inside the script of ``sh -c`` (or ``python -c`` ...) is
  refused, and a value that would start an argv element with ``-`` before a
  ``--`` is refused at run time (:class:`UnsafeArgument`).
* **A supervisor per attempt** (:mod:`.supervisor_main`, a stdlib-only file
  run as ``python -I -S``): child subreaper, rlimits before ``exec``, own
  process group, reports the exit status and CPU time, and SIGKILLs the whole
  tree when the process running the task dies (:mod:`.supervise`).
* **Stopping** (timeout, cancel, or processes left behind after the program
  exits): SIGTERM to the group and to every descendant of the supervisor,
  then SIGKILL after ``grace`` seconds, repeated until none is left
  (``TaskTimedOut`` / ``TaskCancelled``).
* **Sandbox** (``sandbox="bwrap"``): a new user namespace with no
  capability, whoever runs it (:mod:`.sandbox`); inside it a stdlib reporter
  applies the rlimits and tells the program's own wait status, so a signal is
  named and a sandbox ended early is a failure, never exit 0 (:mod:`.report`).

The package: ``limits`` (rlimits), ``errors``, ``params`` (placeholders),
``tree`` (process tree, on :mod:`ledgerflow.procs`), ``supervise`` (driver
side), ``supervisor_main`` (the supervisor), ``sandbox`` (bwrap argv), ``report``
(the status from inside the sandbox),
``code`` (argv elements read as code), ``task`` (:class:`ProgramSpec`,
:class:`ProgramTask`). Linux only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from ..errors import DefinitionError
from ..keys import digest
from ..task import TaskOptions
from .code import check_code_placeholders
from .errors import LimitExceeded, ProgramError, SandboxUnavailable, UnsafeArgument
from .limits import Limits
from .params import carrier_env
from .sandbox import VIEWS
from .task import MINIMAL_ENV, ProgramResult, ProgramSpec, ProgramTask
from .tree import alive, descendants, is_supervisor, supervisor_pids

__all__ = [
    "MINIMAL_ENV",
    "LimitExceeded",
    "Limits",
    "ProgramError",
    "ProgramResult",
    "ProgramTask",
    "SandboxUnavailable",
    "UnsafeArgument",
    "alive",
    "carrier_env",
    "descendants",
    "is_supervisor",
    "program",
    "supervisor_pids",
]

def program(name: str, argv: Sequence[str] | str, *, env: Mapping[str, str] | None = None,
            inherit_env: bool | None = None, cwd: str | os.PathLike[str] | None = None,
            timeout: float | None = None, grace: float = 5.0,
            ok_codes: Iterable[int] = (0,), limits: Limits | None = None,
            sandbox: Literal["bwrap"] | None = None, network: bool = True,
            view: Literal["host", "declared"] = "host",
            read_only: Sequence[str] = (), writable: Sequence[str] = (),
            outputs: Sequence[str] = (), inputs: Sequence[str] = (), shell: bool = False,
            output_cap: int = 64 * 1024, retries: int = 0, retry_delay: float = 0.0,
            backoff: float = 1.0, jitter: float = 0.0,
            retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
            cache: bool = True, version: str | None = None) -> ProgramTask:
    """Make a task that runs a program.

    Args:
        name: the task name.
        argv: the command, one element per argument; ``{param}`` placeholders are
            filled from the call's keyword arguments inside their element. With
            ``shell=True``, one command string for ``/bin/sh -c`` (no placeholders).
        env: extra environment variables (values may hold placeholders); the
            call's parameters are also set as ``LEDGERFLOW_PARAM_<NAME>``.
        inherit_env: start from the task process's environment; else only
            :data:`MINIMAL_ENV` (``PATH``, ``LANG``, ``LC_ALL``, ``TZ``). Default:
            inherit, except in the sandbox (pass ``env=`` or ``inherit_env=True``).
        cwd: working directory (may hold placeholders); default: the task's.
        timeout: seconds the program may run; then its tree is stopped and the
            attempt ends ``timeout`` (retried by policy).
        grace: seconds between SIGTERM and SIGKILL when stopping the tree.
        ok_codes: exit codes that count as success.
        limits: rlimits for the program (:class:`Limits`).
        sandbox: ``"bwrap"`` runs it under bubblewrap: a new user namespace with
            no capability, read-only file system, private /tmp, own pid
            namespace; only ``writable`` paths (and the folders of ``outputs``)
            can be written. Refused (:class:`SandboxUnavailable`) where it
            cannot be made so.
        network: with the sandbox, ``False`` leaves only a loopback of its own
            and hides the host's Unix sockets under /run, /tmp and /var/tmp.
        view: with the sandbox, ``"host"`` (the host's / read-only) or
            ``"declared"`` (only the OS, the Python installation and the
            declared paths; see :mod:`ledgerflow.programs.sandbox`).
        read_only: with the sandbox, paths kept read-only (also inside writable ones).
        writable: with the sandbox, paths the program may write (made if missing).
        outputs: files the program writes; checked, hashed and recorded as lineage.
        inputs: files or folders it reads; hashed into the fingerprint and lineage.
        shell: run ``argv`` (a string) with ``/bin/sh -c``.
        output_cap: bytes of each stream kept in the result (half head, half tail).
        retries, retry_delay, backoff, jitter, retry_on, cache: as for ``@task``.
        version: added to the fingerprint (argv, env and the other settings
            that change what runs are always in it).

    Example:
        >>> from ledgerflow import program
        >>> hello = program("hello", ["echo", "hello {who}"])
        >>> hello(who="world")["stdout"]       # the output is echoed to the task's log too
        hello world
        'hello world\\n'
    """
    if shell:
        if not isinstance(argv, str):
            raise DefinitionError(f"program {name!r}: shell=True needs one command string",
                                  hint='pass argv="cmd \\"$LEDGERFLOW_PARAM_X\\""')
        argv_t: tuple[str, ...] = (argv,)
    else:
        if isinstance(argv, str):
            raise DefinitionError(
                f"program {name!r}: argv is a string; without a shell it must be a list",
                hint=f"pass argv={argv.split()!r}, or shell=True if you need a shell")
        argv_t = tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv)
        if not argv_t or not all(isinstance(a, str) for a in argv_t):
            raise DefinitionError(f"program {name!r}: argv must be a non-empty list of strings",
                                  hint='e.g. argv=["pdftotext", "{src}", "-"]')
        check_code_placeholders(name, argv_t)
    if timeout is not None and timeout <= 0:
        raise DefinitionError(f"program {name!r}: timeout must be positive, given {timeout}",
                              hint="pass timeout=None for no limit")
    if output_cap < 2:
        raise DefinitionError(f"program {name!r}: output_cap must be at least 2 bytes",
                              hint="output_cap=65536 keeps 32 KiB of head and of tail")
    if grace < 0:
        raise DefinitionError(f"program {name!r}: grace must be 0 or more, given {grace}",
                              hint="grace=5 waits 5 s between SIGTERM and SIGKILL")
    if sandbox not in (None, "bwrap"):
        raise DefinitionError(f"program {name!r}: unknown sandbox {sandbox!r}",
                              hint='use sandbox="bwrap" or leave it out')
    if view not in VIEWS:
        raise DefinitionError(f"program {name!r}: unknown view {view!r}",
                              hint='use view="host" or view="declared"')
    if sandbox is None and (not network or read_only or writable or view != "host"):
        raise DefinitionError(
            f"program {name!r}: network=False, view, read_only and writable need a sandbox",
            hint='add sandbox="bwrap" (Debian package bubblewrap)')
    inherit = inherit_env if inherit_env is not None else sandbox is None
    spec = ProgramSpec(
        name=name, argv=argv_t, env=tuple(sorted((env or {}).items())),
        inherit_env=inherit, cwd=os.fspath(cwd) if cwd is not None else None,
        timeout=timeout, grace=float(grace), ok_codes=tuple(ok_codes), limits=limits,
        sandbox=sandbox, network=network, read_only=tuple(read_only),
        writable=tuple(writable), outputs=tuple(outputs), inputs=tuple(inputs), shell=shell,
        output_cap=output_cap, view=view)
    settings = {"argv": spec.argv, "env": spec.env, "inherit_env": inherit,
                "cwd": spec.cwd, "ok_codes": spec.ok_codes, "shell": shell,
                "limits": limits.rlimits() if limits else None, "sandbox": sandbox,
                "network": network, "read_only": spec.read_only,
                "writable": spec.writable, "outputs": spec.outputs,
                "inputs": spec.inputs, "version": version}
    if view != "host":          # only when set: the fingerprints of existing programs stay
        settings["view"] = view
    what = json.dumps(settings, sort_keys=True)
    # no runner-level timeout: the task enforces its own and ends only once the tree is gone
    options = TaskOptions.from_arguments(
        retries=retries, retry_delay=retry_delay, backoff=backoff, jitter=jitter,
        timeout=None, retry_on=retry_on, cache=cache,
        version="program:" + digest(what.encode()), name=name, side_effects=True)
    return ProgramTask(spec, options)
