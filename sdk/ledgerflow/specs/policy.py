"""Policies: which tasks, paths, network, models, keys, tools and budget a spec may use.

A policy is a small TOML file; every key is an allowlist and a missing key
puts no limit on that kind (TOML: the plain keys come before the first
``[table]``)::

    network = false              # true, false, or a list of host names
    models = ["local", "mock"]   # model providers (agent tasks, pipeline draft)
    keys = ["OPENAI_API_KEY"]    # key aliases: names of environment variables
    tools = ["search_index"]     # tools agent tasks may call
    programs = ["pdftotext"]     # executables program tasks may run
    max_budget_usd = 0.50        # the sum of the steps' declared budgets

    [tasks]
    allow = ["recipes/doc_index/pipeline.py:*", "mypkg.steps:*"]   # import-path globs
    deny = ["*:prune"]

    [paths]                      # relative entries: from this file's folder
    read = ["docs/"]             # a folder allows everything under it; globs allowed
    write = ["indexes/", "*.duckdb"]

    [needs."*:update_index"]     # what a task touches, when it does not declare it
    writes = ["{index}"]         # {name}: the value of that argument in the step

What a step needs comes from three places, merged: the task's own
declaration (:func:`needs`, or the ``ledgerflow_needs`` attribute any
decorator can set, e.g. an agent task's tools, model, key and budget), what a
program task's settings say (its executable, ``inputs``/``outputs``,
``writable``, ``network`` and whether it is sandboxed), and the policy's own
``[needs."GLOB"]`` tables. The policy checks these declarations before
anything runs; it does not sandbox Python code (a program task's
``sandbox="bwrap"`` does, at run time).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar

from ..errors import InputError
from .problems import Problem, step_path

T = TypeVar("T")

#: The keys a policy file may have.
POLICY_KEYS: Final = ("tasks", "paths", "network", "models", "keys", "tools", "programs",
                      "max_budget_usd", "needs")
#: The kinds of need a task can declare.
NEED_KEYS: Final = ("tools", "reads", "writes", "network", "models", "keys", "programs",
                    "budget_usd")
_GLOB = frozenset("*?[")


def needs(*, tools: Sequence[str] = (), reads: Sequence[str] = (), writes: Sequence[str] = (),
          network: bool | Sequence[str] | None = None, models: Sequence[str] = (),
          keys: Sequence[str] = (), programs: Sequence[str] = (),
          budget_usd: float | str | None = None) -> Callable[[T], T]:
    """Declare what a task touches, for policies; ``{name}`` stands for that argument.

    Put it above ``@task``. It changes nothing at run time.

    Example:
        >>> from ledgerflow import task
        >>> @needs(writes=["{index}"], network=False)
        ... @task
        ... def update(index: str) -> None: ...
        >>> update.ledgerflow_needs["writes"]
        ['{index}']
    """
    decl: dict[str, Any] = {"tools": list(tools), "reads": list(reads),
                            "writes": list(writes), "models": list(models),
                            "keys": list(keys), "programs": list(programs)}
    if network is not None:
        decl["network"] = network if isinstance(network, bool) else list(network)
    if budget_usd is not None:
        decl["budget_usd"] = budget_usd

    def wrap(t: T) -> T:
        setattr(t, "ledgerflow_needs", {**dict(getattr(t, "ledgerflow_needs", {}) or {}),  # noqa: B010
                                        **decl})
        return t
    return wrap


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded policy (see the module docstring for the file)."""

    path: str
    folder: str
    tasks_allow: tuple[str, ...] | None = None
    tasks_deny: tuple[str, ...] = ()
    read: tuple[str, ...] | None = None
    write: tuple[str, ...] | None = None
    network: bool | tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    keys: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    programs: tuple[str, ...] | None = None
    max_budget_usd: float | None = None
    needs: tuple[tuple[str, Mapping[str, Any]], ...] = field(default_factory=tuple)

    def allows_model(self, name: str) -> bool:
        """True if the model provider ``name`` (``openai:gpt-4o`` counts as ``openai``) may be used."""
        if self.models is None:
            return True
        return name in self.models or name.partition(":")[0] in self.models


def _strings(doc: Mapping[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    if key not in doc:
        return None
    value = doc[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"policy {where}: {key} must be a list of strings, given {value!r}",
                         hint=f'e.g. {key} = ["..."]')
    return tuple(value)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read a POLICY.toml file.

    Raises:
        InputError: the file is missing, is not TOML, or has unknown keys or bad values.
    """
    import tomllib  # Python 3.11+

    p = Path(path)
    try:
        doc = tomllib.loads(p.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read policy {path}: {exc.strerror}",
                         hint="pass an existing POLICY.toml") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"policy {path} is not valid UTF-8 text (at offset {exc.start})",
                         hint="save the file as UTF-8") from None
    except RecursionError:
        raise InputError(f"policy {path} is not valid TOML: its values nest too deeply to "
                         "read", hint="a policy is a few flat tables") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"policy {path} is not valid TOML: {exc}",
                         hint="fix the file's syntax") from None
    unknown = sorted(set(doc) - set(POLICY_KEYS))
    if unknown:
        raise InputError(f"policy {path} has unknown key(s): {', '.join(unknown)}",
                         hint="known keys: " + ", ".join(POLICY_KEYS))
    folder = str(p.resolve().parent)
    tasks = doc.get("tasks", {})
    paths = doc.get("paths", {})
    for name, table, keys in (("tasks", tasks, ("allow", "deny")),
                              ("paths", paths, ("read", "write"))):
        if not isinstance(table, dict):
            raise InputError(f"policy {path}: [{name}] must be a table",
                             hint=f"[{name}]\n{keys[0]} = [...]")
        bad = sorted(set(table) - set(keys))
        if bad:
            moved = [b for b in bad if b in POLICY_KEYS]
            raise InputError(f"policy {path}: [{name}] has unknown key(s): {', '.join(bad)}",
                             hint=f"[{name}] takes: {', '.join(keys)}" + (
                                 f"; put {', '.join(moved)} above the first [table] (in TOML "
                                 "a key after [table] belongs to that table)" if moved else ""))
    network = doc.get("network")
    if network is not None and not isinstance(network, bool):
        network = _strings(doc, "network", str(path))
    budget = doc.get("max_budget_usd")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or budget < 0):
        raise InputError(f"policy {path}: max_budget_usd must be a number of dollars, "
                         f"given {budget!r}", hint="e.g. max_budget_usd = 0.50")
    raw_needs = doc.get("needs", {})
    if not isinstance(raw_needs, dict) or not all(isinstance(v, dict) for v in raw_needs.values()):
        raise InputError(f"policy {path}: [needs] must hold tables: [needs.\"GLOB\"]",
                         hint='[needs."*:update_index"]\nwrites = ["{index}"]')
    for glob, decl in raw_needs.items():
        bad = sorted(set(decl) - set(NEED_KEYS))
        if bad:
            raise InputError(f"policy {path}: [needs.{glob!r}] has unknown key(s): "
                             f"{', '.join(bad)}", hint="known: " + ", ".join(NEED_KEYS))
    return Policy(
        path=str(p), folder=folder,
        tasks_allow=_strings(tasks, "allow", str(path)),
        tasks_deny=_strings(tasks, "deny", str(path)) or (),
        read=_absolute(_strings(paths, "read", str(path)), folder),
        write=_absolute(_strings(paths, "write", str(path)), folder),
        network=network, models=_strings(doc, "models", str(path)),
        keys=_strings(doc, "keys", str(path)), tools=_strings(doc, "tools", str(path)),
        programs=_strings(doc, "programs", str(path)),
        max_budget_usd=float(budget) if budget is not None else None,
        needs=tuple((g, dict(d)) for g, d in raw_needs.items()))


def _absolute(entries: tuple[str, ...] | None, folder: str) -> tuple[str, ...] | None:
    if entries is None:
        return None
    out = []
    for e in entries:
        e = os.path.expanduser(e)
        out.append(os.path.normpath(e if os.path.isabs(e) else os.path.join(folder, e))
                   + ("/" if e.endswith("/") else ""))
    return tuple(out)


def _real_glob(pattern: str) -> str:
    """``pattern`` with the folders before its first glob character resolved (symlinks)."""
    cut = min(pattern.index(c) for c in _GLOB if c in pattern)
    head, _, _ = pattern[:cut].rpartition("/")
    return os.path.realpath(head or "/").rstrip("/") + pattern[len(head):]


def path_allowed(path: str, patterns: Iterable[str]) -> bool:
    """True if ``path`` is one of ``patterns``, under a folder of them, or matches a glob.

    What counts is where ``path`` really is (symlinks resolved): ``link/x.duckdb``
    with ``link`` pointing out of the folder does not match ``*.duckdb`` there.
    """
    p = os.path.realpath(path)
    for pat in patterns:
        if _GLOB & set(pat):
            if fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, _real_glob(pat)):
                return True
            continue
        q = os.path.realpath(pat)
        if p == q or p.startswith(q.rstrip("/") + "/"):
            return True
    return False


def _ref_matches(ref: str, globs: Iterable[str], folder: str | None) -> bool:
    forms = {ref}
    mod, _, attr = ref.rpartition(":")
    if mod.endswith(".py") and folder is not None and not os.path.isabs(mod):
        forms.add(os.path.normpath(os.path.join(folder, mod)) + ":" + attr)
    return any(fnmatch.fnmatchcase(f, g) for f in forms for g in globs)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepUse:
    """What the policy needs to know about one step of a spec."""

    key: str
    ref: str
    task: Any
    #: literal arguments, with the defaults of parameters not given
    args: Mapping[str, Any]
    #: parameter -> the step whose result feeds it (known only at run time)
    fed: Mapping[str, str]
    is_map: bool = False


def declared(step: StepUse, policy: Policy | None) -> dict[str, list[Any]]:
    """What ``step`` needs, merged from its task, its program settings and the policy."""
    out: dict[str, list[Any]] = {k: [] for k in NEED_KEYS}
    sources: list[Mapping[str, Any]] = []
    own = getattr(step.task, "ledgerflow_needs", None)
    if isinstance(own, Mapping):
        sources.append(own)
    prog = getattr(step.task, "spec", None)
    if prog is not None and hasattr(prog, "argv") and hasattr(prog, "sandbox"):
        boxed = prog.sandbox is not None
        sources.append({
            "programs": ["/bin/sh" if prog.shell else prog.argv[0]],
            "reads": [*prog.inputs, *prog.read_only] if boxed else ["*"],
            "writes": [*prog.outputs, *prog.writable] if boxed else ["*"],
            "network": bool(prog.network) if boxed else True})
    if policy is not None:
        for glob, decl in policy.needs:
            if _ref_matches(step.ref, [glob], None):
                sources.append(decl)
    for src in sources:
        for k in NEED_KEYS:
            if k not in src or src[k] is None:
                continue
            v = src[k]
            out[k].extend(v if isinstance(v, (list, tuple)) else [v])
    return out


_UNKNOWN = object()


def fill_need(template: Any, step: StepUse) -> list[Any] | str:
    """The values of a declaration with ``{name}`` filled from the step's arguments;
    or the name of the step that feeds a placeholder (then it is known only at run time)."""
    if not isinstance(template, str) or "{" not in template:
        return [template]
    import string
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    values: dict[str, Any] = {}
    for n in names:
        if n in step.fed:
            return step.fed[n]
        if n not in step.args or step.args[n] is None:
            return []             # not given and no default: nothing to check
        values[n] = step.args[n]
    lists = [n for n, v in values.items() if isinstance(v, (list, tuple))]
    if not lists:
        out = [template.format(**{k: str(v) for k, v in values.items()})]
    else:
        out = [template.format(**{k: str(item if k == lists[0] else v)
                                  for k, v in values.items()}) for item in values[lists[0]]]
    return [v for v in out if v != ""]     # an empty argument declares nothing (no key)


def check(steps: Sequence[StepUse], policy: Policy, *, folder: str | None = None,
          cwd: str | None = None) -> list[Problem]:
    """Every way ``steps`` go beyond ``policy``, as problems with their paths.

    Args:
        steps: the spec's steps (their tasks resolved).
        policy: the policy to hold them to.
        folder: the spec's folder (for ``file.py:task`` references).
        cwd: where relative paths in arguments are taken from (default: here).
    """
    problems: list[Problem] = []
    base = cwd or os.getcwd()
    policy = replace(policy, path=_rel(policy.path))
    budget_total = 0.0
    for step in steps:
        at = step_path(step.key)
        if policy.tasks_allow is not None and not _ref_matches(step.ref, policy.tasks_allow,
                                                               folder):
            problems.append(Problem(
                path=step_path(step.key, "task"), code="policy.task",
                message=f"task {step.ref!r} is not allowed by policy {policy.path}",
                hint="use one of the allowed tasks: " + ", ".join(policy.tasks_allow)))
        elif _ref_matches(step.ref, policy.tasks_deny, folder):
            problems.append(Problem(
                path=step_path(step.key, "task"), code="policy.task",
                message=f"task {step.ref!r} is denied by policy {policy.path}",
                hint="remove this step or use another task"))
        need = declared(step, policy)
        for kind, allowed, code, what in (
                ("tools", policy.tools, "policy.tool", "tool"),
                ("models", policy.models, "policy.model", "model"),
                ("keys", policy.keys, "policy.key", "key alias"),
                ("programs", policy.programs, "policy.program", "program")):
            if allowed is None:
                continue
            for template in need[kind]:
                filled = fill_need(template, step)
                if isinstance(filled, str):
                    problems.append(_unchecked(step, template, filled, what))
                    continue
                for value in filled:
                    name = str(value)
                    ok = name in allowed or (kind == "models"
                                             and name.partition(":")[0] in allowed) \
                        or (kind == "programs" and os.path.basename(name) in allowed)
                    if not ok:
                        problems.append(Problem(
                            path=_where(step, template), code=code,
                            message=f"step {step.key!r} uses {what} {name!r}, which policy "
                            f"{policy.path} does not allow",
                            hint=f"allowed {what}s: " + (", ".join(allowed) or "none")))
        for kind, allowed, code, verb in (("reads", policy.read, "policy.read", "read"),
                                          ("writes", policy.write, "policy.write", "write")):
            if allowed is None:
                continue
            for template in need[kind]:
                if template == "*":
                    problems.append(Problem(
                        path=at, code=code,
                        message=f"step {step.key!r} runs a program outside a sandbox: it may "
                        f"{verb} any path, and policy {policy.path} restricts {kind}",
                        hint='make it a sandboxed program task: sandbox="bwrap" with '
                        "inputs/outputs/writable listing its paths"))
                    continue
                filled = fill_need(template, step)
                if isinstance(filled, str):
                    problems.append(_unchecked(step, template, filled, "path"))
                    continue
                for value in filled:
                    path = os.path.join(base, os.path.expanduser(str(value)))
                    if not path_allowed(path, allowed):
                        problems.append(Problem(
                            path=_where(step, template), code=code,
                            message=f"step {step.key!r} would {verb} {str(value)!r}, outside "
                            f"what policy {policy.path} allows to {verb}",
                            hint=f"{verb} under: " + (", ".join(map(_rel, allowed))
                                                       or "nothing")))
        if policy.network is not None:
            for want in need["network"]:
                if want is False:
                    continue
                if policy.network is True:
                    continue
                hosts = () if policy.network is False else policy.network
                if want is True:
                    problems.append(Problem(
                        path=at, code="policy.network",
                        message=f"step {step.key!r} uses the network (any host), which policy "
                        f"{policy.path} " + ("does not allow" if not hosts else
                                             "limits to " + ", ".join(hosts)),
                        hint="use a task without network access"
                        + (", or one that declares only these hosts" if hosts else "")))
                    continue
                filled = fill_need(want, step)
                if isinstance(filled, str):
                    problems.append(_unchecked(step, want, filled, "host"))
                    continue
                for host in filled:
                    if str(host) not in hosts:
                        problems.append(Problem(
                            path=_where(step, want), code="policy.network",
                            message=f"step {step.key!r} connects to {host!r}, which policy "
                            f"{policy.path} does not allow",
                            hint="allowed hosts: " + (", ".join(hosts) or "none")))
        if policy.max_budget_usd is not None:
            for template in need["budget_usd"]:
                filled = fill_need(template, step)
                if isinstance(filled, str):
                    problems.append(_unchecked(step, template, filled, "budget"))
                    continue
                for value in filled:
                    try:
                        amount = float(value)
                    except (TypeError, ValueError):
                        problems.append(Problem(
                            path=_where(step, template), code="policy.budget",
                            message=f"step {step.key!r} declares a budget of {value!r}, "
                            "not a number of dollars", hint="give the budget as a number"))
                        continue
                    if step.is_map:
                        problems.append(Problem(
                            path=at, code="policy.budget",
                            message=f"step {step.key!r} fans out over items known only at run "
                            f"time, each with a budget of ${amount:g}: its total cannot be "
                            f"held to the policy's ${policy.max_budget_usd:g}",
                            hint="run it on a fixed list, or without a per-item budget"))
                    budget_total += amount
    if policy.max_budget_usd is not None and budget_total > policy.max_budget_usd + 1e-12:
        problems.append(Problem(
            path="tasks", code="policy.budget",
            message=f"the steps' budgets add up to ${budget_total:g}, more than the "
            f"${policy.max_budget_usd:g} policy {policy.path} allows",
            hint="lower the steps' budgets or use fewer model steps"))
    return problems


def _rel(path: str) -> str:
    """``path`` relative to the working directory when it is inside it (for messages)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel + ("/" if path.endswith("/") else "")


def _where(step: StepUse, template: Any) -> str:
    """The argument a declaration comes from (``tasks.K.args.index``), else the step."""
    if isinstance(template, str) and template.startswith("{") and template.endswith("}") \
            and template.count("{") == 1:
        return step_path(step.key, "args", template[1:-1])
    return step_path(step.key)


def _unchecked(step: StepUse, template: str, feeder: str, what: str) -> Problem:
    name = template.strip("{}") if template.count("{") == 1 else template
    return Problem(
        path=step_path(step.key, "inputs", name) if name in step.fed else step_path(step.key),
        code="policy.unchecked",
        message=f"step {step.key!r} takes the {what} {template!r} from step {feeder!r}, so "
        "the policy cannot check it before the run",
        hint=f"give {name} literally in args so the policy can check it")
