"""The program task: what one call runs (:class:`ProgramSpec`) and :class:`ProgramTask`.

A call fills the placeholders, builds the environment, starts the program
under its supervisor (in the sandbox if asked), and turns how it ended into a
:class:`ProgramResult` or an error (:mod:`ledgerflow.programs.errors`).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ..context import TaskCancelled, TaskTimedOut, context, current_build
from ..errors import DefinitionError
from ..task import Task, TaskOptions
from . import sandbox
from .errors import LimitExceeded, ProgramError, UnsafeArgument
from .limits import Limits, limit_hit
from .params import carrier_env, fill, hash_path, names, text
from .report import Report
from .supervise import Ended, Stream, Supervised

__all__ = ["MINIMAL_ENV", "ProgramResult", "ProgramSpec", "ProgramTask"]

#: The variables a program gets from the task's environment when it does not
#: inherit it (besides ``env=`` and the ``LEDGERFLOW_*`` ones).
MINIMAL_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?")


class ProgramResult(TypedDict):
    """What a program task returns (JSON; stored as the task's result)."""

    argv: list[str]
    exit_code: int | None          # None when a signal ended it
    signal: str | None             # e.g. "SIGKILL"
    stdout: str                    # head and tail; a marker line says what was dropped
    stderr: str
    stdout_bytes: int              # total bytes the program wrote
    stderr_bytes: int
    stdout_dropped: int            # bytes left out between head and tail
    stderr_dropped: int
    outputs: dict[str, str]        # declared output path -> content hash


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    """What a program task runs: the callable behind a :class:`ProgramTask`.

    Small, immutable and picklable by reference to this module, so it travels
    to process and Dask workers as it is.
    """

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    inherit_env: bool
    cwd: str | None
    timeout: float | None
    grace: float
    ok_codes: tuple[int, ...]
    limits: Limits | None
    sandbox: str | None
    network: bool
    read_only: tuple[str, ...]
    writable: tuple[str, ...]
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    shell: bool
    output_cap: int
    view: str = "host"

    @property
    def stop_grace(self) -> float:
        """Seconds this task may need to stop after a cancel request (TERM, grace, KILL)."""
        return 2 * self.grace + 2.0

    def placeholders(self) -> set[str]:
        """Every ``{name}`` the templates use."""
        found: set[str] = set()
        templates = [*self.inputs, *self.outputs, *(v for _, v in self.env)]
        if not self.shell:
            templates += self.argv
        if self.cwd:
            templates.append(self.cwd)
        for t in templates:
            found |= names(t)
        return found

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's parameters by name (a ``.map`` item arrives as ``item``)."""
        if len(args) > 1:
            raise TypeError(f"program task {self.name!r} takes keyword arguments "
                            f"(and one positional item from .map), given {len(args)} "
                            "positional arguments")
        params = dict(kwargs)
        if args:
            if "item" in params:
                raise TypeError(f"program task {self.name!r} got 'item' twice")
            params["item"] = args[0]
        return params

    def _paths(self, templates: Sequence[str], values: Mapping[str, str],
               cwd: str | None) -> list[str]:
        """The declared paths for this call; a value may not lead one out of its folder.

        ``outputs=["out/{name}.txt"]`` with ``name="../../etc/x"`` would make ``/etc``
        writable in the sandbox: a path whose template names a folder before its first
        placeholder must stay in that folder (a template that starts with a
        placeholder lets the value choose the whole path). Symlinks count: a link the
        program left in ``out/`` does not lead a later path out either.
        """
        base = cwd or os.getcwd()
        out = []
        for t in templates:
            path = os.path.normpath(os.path.join(base, fill(t, values)))
            fixed = t.split("{", 1)[0].rpartition("/")[0] if names(t) else ""
            if fixed:
                folder = os.path.normpath(os.path.join(base, fixed))
                if not _inside(path, folder) or not _inside(os.path.realpath(path),
                                                           os.path.realpath(folder)):
                    raise UnsafeArgument(
                        f"program {self.name!r}: the path {t!r} filled with "
                        f"{ {k: values[k] for k in sorted(names(t))} } is {path}, outside "
                        f"{folder}; it was not run (hint: pass a name without '..')")
            out.append(path)
        return out

    def input_hashes(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                     ) -> list[tuple[str, str | None]]:
        """``(path, content hash or None)`` of each declared input for this call."""
        if not self.inputs:
            return []
        values = {k: text(v) for k, v in self.bind(args, kwargs).items()}
        cwd = os.path.abspath(fill(self.cwd, values)) if self.cwd else None
        return [(p, hash_path(p)) for p in self._paths(self.inputs, values, cwd)]

    def _argv(self, values: Mapping[str, str]) -> list[str]:
        """argv with its placeholders filled; a value that would read as an option is refused.

        An element that *starts* with a placeholder before any ``--`` must not
        become ``-...`` (a negative number is fine): ``src="-o/etc/x"`` would be
        taken as an option by most programs.
        """
        out: list[str] = []
        options_end = False
        for template in self.argv:
            value = fill(template, values)
            first = names(template[:template.index("}") + 1]) if template.startswith("{") \
                and not template.startswith("{{") else set()
            if first and not options_end and value.startswith("-") \
                    and not _NUMBER.fullmatch(value):
                (param,) = first
                raise UnsafeArgument(
                    f"program {self.name!r}: parameter {param}={values[param]!r} would reach "
                    f"the program as an option ({value!r}); it was not run (hint: put '--' "
                    "before the positional arguments in argv, or pass a path as ./-name)")
            options_end = options_end or template == "--"
            out.append(value)
        return out

    def _environment(self, values: Mapping[str, str]) -> dict[str, str]:
        ctx = context()
        if self.inherit_env:
            env = dict(os.environ)
        else:
            env = {k: os.environ[k] for k in MINIMAL_ENV if k in os.environ}
            env.setdefault("PATH", os.defpath)
        if ctx.carrier:     # trace context of the attempt (TRACEPARENT...), unless env= sets it
            env.update(carrier_env(ctx.carrier))
        env.update({k: fill(v, values) for k, v in self.env})
        env.update({f"LEDGERFLOW_PARAM_{k.upper()}": v for k, v in values.items()})
        env.update(LEDGERFLOW_RUN_ID=ctx.run_id, LEDGERFLOW_TASK_KEY=ctx.task_key,
                   LEDGERFLOW_ATTEMPT=str(ctx.attempt))
        return env

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramResult:
        params = self.bind(args, kwargs)
        missing = self.placeholders() - set(params)
        if missing:
            raise TypeError(f"program task {self.name!r} needs the parameters "
                            f"{sorted(missing)} used in its placeholders")
        ctx = context()
        values = {k: text(v) for k, v in params.items()}
        cwd = os.path.abspath(fill(self.cwd, values)) if self.cwd else None
        argv = ["/bin/sh", "-c", self.argv[0]] if self.shell else self._argv(values)
        env = self._environment(values)
        for path, chash in self.input_hashes(args, kwargs):
            ctx.record_input(path, chash)
        outputs = self._paths(self.outputs, values, cwd)
        for path in outputs:            # a stale file from an earlier attempt is no output
            if os.path.isfile(path):
                os.unlink(path)
        command = argv
        rlimits = self.limits.rlimits() if self.limits else []
        report: Report | None = None
        if self.sandbox == "bwrap":
            exe = sandbox.check(self.name)
            here = cwd or os.getcwd()
            command = sandbox.bwrap_argv(
                exe, cwd=here, visible=[*([here] if cwd or self.view == "host" else []),
                                        *self._paths(self.inputs, values, cwd)],
                writable=[*self._paths(self.writable, values, cwd),
                          *(os.path.dirname(p) for p in outputs)],
                read_only=self._paths(self.read_only, values, cwd), network=self.network,
                view=self.view)
            # the program's own status comes back on a pipe (bwrap only passes on 128+n),
            # and the rlimits apply to the program, not to bwrap and the reporter
            report = Report()
            command += report.argv(sys.executable or "python3", rlimits) + argv
            rlimits = []
        try:
            try:
                tree = Supervised(command, env, cwd, rlimits,
                                  keep_fds=(report.w,) if report else ())
            except OSError as exc:
                raise ProgramError(f"program {self.name!r} could not start: {exc}") from None
            if report:
                report.started()
            out = Stream(self.output_cap, lambda: sys.stdout)
            err = Stream(self.output_cap, lambda: sys.stderr)
            try:
                ended = tree.follow(out, err, timeout=self.timeout, grace=self.grace,
                                    cancelled=lambda: ctx.cancel_requested)
            finally:
                tree.close()
            if report:
                ended = report.settle(ended)
        finally:
            if report:
                report.close()
        return self._result(ended, argv, out, err, outputs)

    def _result(self, ended: Ended, argv: list[str], out: Stream, err: Stream,
                outputs: list[str]) -> ProgramResult:
        ctx = context()
        how = f"TERM, then KILL after {self.grace:g}s"
        if ended.stopped == "timeout":
            raise TaskTimedOut(f"program {self.name!r} ran past its {self.timeout:g}s timeout; "
                               f"its process tree was stopped ({how})")
        if ended.stopped == "cancel":
            raise TaskCancelled(f"program {self.name!r} cancelled; its process tree was "
                                f"stopped ({how})")
        if ended.exec_error:
            raise ProgramError(f"program {self.name!r} could not start {argv[0]!r}: "
                               f"{ended.exec_error}", 127)
        if ended.status is None:
            raise ProgramError(f"program {self.name!r}: its supervisor died; exit unknown")
        code = os.waitstatus_to_exitcode(ended.status)
        sig = -code if code < 0 else None
        exit_code = None if sig is not None else code
        tail = err.last_lines()
        if sig is not None or code not in self.ok_codes or ended.note:
            what = f"was killed by {_signame(sig)}" if sig is not None \
                else f"exited with code {code} (ok: {', '.join(map(str, self.ok_codes))})"
            if ended.note:
                what = f"{what}: {ended.note}" if sig is not None else ended.note
            limit = limit_hit(self.limits, sig, ended.cpu_s, tail)
            stderr = f"; last lines of stderr:\n{tail}" if tail else "; stderr was empty"
            if limit is not None:
                value = getattr(self.limits, limit)
                raise LimitExceeded(f"program {self.name!r} hit its {limit} limit "
                                    f"({limit}={value:g}): it {what}{stderr}", exit_code,
                                    _signame(sig) if sig else None, limit)
            raise ProgramError(f"program {self.name!r} {what}{stderr}", exit_code,
                               _signame(sig) if sig else None)
        hashes: dict[str, str] = {}
        for path in outputs:
            chash = hash_path(path)
            if chash is None:
                raise ProgramError(f"program {self.name!r} exited {code} but did not write "
                                   f"its declared output {path}", exit_code)
            hashes[path] = chash
            ctx.record_output(path, chash)
        stdout, out_dropped = out.kept()
        stderr_text, err_dropped = err.kept()
        return ProgramResult(argv=argv, exit_code=exit_code, signal=None, stdout=stdout,
                             stderr=stderr_text, stdout_bytes=out.total,
                             stderr_bytes=err.total, stdout_dropped=out_dropped,
                             stderr_dropped=err_dropped, outputs=hashes)


class ProgramTask(Task[..., ProgramResult]):
    """A task that runs a program (made by :func:`ledgerflow.programs.program`)."""

    def __init__(self, spec: ProgramSpec, options: TaskOptions) -> None:
        super().__init__(spec, options)
        self.spec = spec

    @property
    def stop_grace(self) -> float:
        """Seconds it may need to stop its tree after a cancel request (executors read it)."""
        return self.spec.stop_grace

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramResult:
        if current_build.get() is not None:        # tracing: check the call now
            params = self.spec.bind(args, {k: v for k, v in kwargs.items() if k != "after"})
            missing = self.spec.placeholders() - set(params)
            if missing:
                raise DefinitionError(
                    f"program task {self.name!r} is called without {sorted(missing)}, "
                    "used in its placeholders",
                    hint="pass them as keyword arguments, e.g. "
                    f"{self.name}({sorted(missing)[0]}=...)")
        return super().__call__(*args, **kwargs)

    def _extra_fingerprint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The content hashes of the declared input files of this call."""
        try:
            pairs = self.spec.input_hashes(args, kwargs)
        except Exception as exc:   # e.g. a placeholder without a parameter: fails at run time
            return f"unhashable inputs: {exc}".encode()
        return b"\x00".join(f"{p}={h or 'missing'}".encode() for p, h in pairs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProgramTask, (self.fn, self.options))

    def __repr__(self) -> str:
        return f"<program {self.name}>"
