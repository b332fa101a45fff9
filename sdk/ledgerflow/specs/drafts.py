"""Machine-written specs: the draft header, the content digest, and approving a draft.

``pipeline draft`` writes a spec with a header that marks it machine-written
(TOML comments, or a ``"$draft"`` key in JSON)::

    # ledgerflow draft: machine-written by `pipeline draft`; it runs only once a
    # person has reviewed it and approved its digest:
    #   pipeline validate draft.toml --plan
    #   pipeline approve-draft draft.toml --digest 3fa9c2d1e0b4
    # draft-digest: 3fa9c2d1e0b4...
    # draft-run: 20261201-101010-abcdef
    # draft-model: mock
    # draft-request: index the markdown files in docs/ into docs.duckdb
    # draft-tasks: ["/home/ana/proj/steps.py"]
    # draft-policy: "/home/ana/proj/POLICY.toml"

The **digest** is the canonical digest of the spec's content (sorted-key
compact JSON of the parsed document without the header), so formatting and
comments do not change it and every edit of a value does. ``pipeline run`` of
a file with the header refuses until that digest is approved; an edited draft
has a new digest and needs a new approval.

An approval is recorded as a decision on the drafting run (the run whose
output the draft is: its model calls are in it), through the store's
``decide``: the same record every approval gate's decision is (who, when,
reason), atomic (of two approvers of one digest exactly one records it), one
per digest, so each edit's approval is its own record, and found again in
one read of that run's decisions. Its task key is :data:`DRAFT_REQUEST`.
Deleting the header makes the file an ordinary, hand-written spec: the gate
is against running a machine's draft unread, not against its author.

**Read as data until approved.** A draft's steps may name only the tasks of
the catalogue it was drafted over (``draft-tasks``: the ``--tasks`` a person
gave ``pipeline draft``), before and after its approval; nothing else a draft
names is ever imported, so ``validate``, ``approve-draft`` and ``run`` of an
unapproved draft run no code the model chose
(:func:`ledgerflow.specs.check.check_draft`).

**Held to its policy at every run.** A draft drafted under a policy
(``pipeline draft --policy``: ``draft-policy``) is checked against that
policy file as it is now whenever it is validated, approved, run, submitted
or resumed (an explicit ``--policy`` takes its place), with relative paths
taken from where the command runs: an approval does not carry a draft past
a policy that was tightened since, or a run from another folder.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..approval import APPROVED
from ..errors import ApprovalConflictError, InputError, RunNotFoundError, StaleDigestError
from ..gates import MIN_PREFIX
from ..identity import decider
from ..keys import digest as content_digest

#: The key of the header in a JSON draft (left out of the digest and the checks).
JSON_KEY: Final = "$draft"
#: The first words of a TOML draft's header.
MARK: Final = "# ledgerflow draft:"
#: The task key a draft's approval is recorded under, in the drafting run.
DRAFT_REQUEST: Final = "draft"
_FIELDS: Final = ("digest", "run", "model", "request", "problems", "tasks", "policy")


class DraftNotApprovedError(InputError):
    """A machine-written draft is run before its current digest was approved."""


@dataclass(frozen=True, slots=True)
class DraftHeader:
    """What the header of a machine-written draft says."""

    digest: str
    run: str
    model: str = ""
    request: str = ""
    problems: int = 0
    #: The task sources the draft was drafted over (its catalogue).
    tasks: tuple[str, ...] = ()
    #: The policy file the draft was drafted under ("" if none).
    policy: str = ""


def spec_digest(doc: Mapping[str, Any]) -> str:
    """The canonical digest of a spec's content (the header left out).

    Example:
        >>> spec_digest({"tasks": {"a": {"task": "m:f"}}}) == spec_digest(
        ...     {"tasks": {"a": {"task": "m:f"}}, "$draft": {"digest": "x"}})
        True
    """
    body = {k: v for k, v in doc.items() if k != JSON_KEY}
    return content_digest(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode())


def parse_header(text: str, doc: object) -> DraftHeader | None:
    """The draft header of a spec file's text (or JSON document), or None."""
    if isinstance(doc, Mapping) and isinstance(doc.get(JSON_KEY), Mapping):
        h = doc[JSON_KEY]
        return DraftHeader(digest=str(h.get("digest", "")), run=str(h.get("run", "")),
                           model=str(h.get("model", "")), request=str(h.get("request", "")),
                           problems=_int(h.get("problems")), tasks=_sources(h.get("tasks")),
                           policy=_text(h.get("policy")))
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or not lines[0].startswith(MARK):
        return None
    found: dict[str, str] = {}
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        body = line[1:].strip()
        if body.startswith("draft-") and ":" in body:
            name, _, value = body[len("draft-"):].partition(":")
            if name in _FIELDS:
                found[name] = value.strip()
    return DraftHeader(digest=found.get("digest", "").split(" ")[0], run=found.get("run", ""),
                       model=found.get("model", ""), request=found.get("request", ""),
                       problems=_int(found.get("problems")),
                       tasks=_sources(found.get("tasks")),
                       policy=_text(found.get("policy")))


def _text(value: object) -> str:
    """A header's string field: JSON-quoted in TOML comments, plain in JSON."""
    if isinstance(value, str) and value.startswith('"'):
        try:
            value = json.loads(value)
        except ValueError:
            return ""
    return value if isinstance(value, str) else ""


def _sources(value: object) -> tuple[str, ...]:
    """The ``draft-tasks`` of a header (a JSON list of strings; else none)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return ()


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


# -- writing ---------------------------------------------------------------------------

def normalise(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document as a draft file stores it: JSON values, ``null`` in tables left out
    (TOML has none; a missing argument takes its default)."""
    def clean(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k): clean(x) for k, x in v.items() if x is not None}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return {str(k): clean(v) for k, v in doc.items() if v is not None and k != JSON_KEY}


def _toml_key(key: str) -> str:
    if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key):
        return key
    return _toml_value(key)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(x)}"
                                for k, x in v.items()) + " }" if v else "{}"
    raise ValueError(f"cannot write {type(v).__name__} {v!r} as TOML")


_STEP_ORDER: Final = ("task", "map", "key", "inputs", "args", "after")


def to_toml(doc: Mapping[str, Any]) -> str:
    """A spec document as TOML text (one ``[tasks.KEY]`` table per step).

    Raises:
        ValueError: a value TOML cannot hold (``null`` inside a list).
    """
    import tomllib
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in doc.items() if k != "tasks"]
    for key, step in dict(doc.get("tasks") or {}).items():
        lines += ["", f"[tasks.{_toml_key(str(key))}]"]
        fields = [f for f in _STEP_ORDER if f in step] + [f for f in step if f not in _STEP_ORDER]
        lines += [f"{_toml_key(f)} = {_toml_value(step[f])}" for f in fields]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != dict(doc):
        raise ValueError("the spec does not survive a round trip through TOML")
    return text


def header_lines(header: DraftHeader, path: str) -> list[str]:
    """The comment lines of a TOML draft's header."""
    shown = os.path.basename(path)
    state = (f"# draft-problems: {header.problems} (pipeline validate {shown} lists them)"
             if header.problems else "# draft-problems: 0")
    request = " ".join(header.request.split())
    return [f"{MARK} machine-written by `pipeline draft`; it runs only once a",
            "# person has reviewed it and approved its digest:",
            f"#   pipeline validate {shown} --plan",
            f"#   pipeline approve-draft {shown} --digest {header.digest[:12]}",
            f"# draft-digest: {header.digest}  (of the content below; any edit changes it)",
            f"# draft-run: {header.run}",
            f"# draft-model: {header.model}",
            f"# draft-request: {request}",
            f"# draft-tasks: {json.dumps(list(header.tasks), ensure_ascii=False)}",
            *([f"# draft-policy: {json.dumps(header.policy, ensure_ascii=False)}"]
              if header.policy else []),
            state]


def render(doc: Mapping[str, Any], header: DraftHeader, path: str) -> str:
    """The text of a draft file: header and spec, as TOML or (``.json``) JSON."""
    if str(path).endswith(".json"):
        h = {"machine_written": True, "digest": header.digest, "run": header.run,
             "model": header.model, "request": header.request, "problems": header.problems,
             "tasks": list(header.tasks), **({"policy": header.policy} if header.policy else {}),
             "approve": f"pipeline approve-draft {os.path.basename(path)} --digest "
                        f"{header.digest[:12]}"}
        return json.dumps({JSON_KEY: h, **doc}, indent=2, ensure_ascii=False) + "\n"
    return "\n".join(header_lines(header, path)) + "\n\n" + to_toml(doc)


def write(path: str | os.PathLike[str], doc: Mapping[str, Any], header: DraftHeader) -> str:
    """Write a draft file atomically; return its text."""
    p = Path(path)
    text = render(doc, header, str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return text


# -- approving -------------------------------------------------------------------------

def approvals(store: Any, header: DraftHeader) -> list[dict[str, Any]]:
    """Every approval recorded for drafts of the run ``header`` names (any digest)."""
    try:
        decisions = store.approval_decisions(header.run)
    except RunNotFoundError:
        return []
    return [d for d in decisions
            if d.get("task_key") == DRAFT_REQUEST and d.get("decision") == APPROVED]


def approval(store: Any, header: DraftHeader, digest: str) -> dict[str, Any] | None:
    """The approval of exactly this digest, or None."""
    return next((d for d in approvals(store, header) if d["digest"] == digest), None)


def approve(store: Any, path: str, header: DraftHeader, digest: str, prefix: str, *,
            by: str | None = None, reason: str = "") -> tuple[dict[str, Any], bool]:
    """Approve the draft at ``path`` whose current digest is ``digest``.

    ``prefix`` must be at least :data:`~ledgerflow.deciding.MIN_PREFIX`
    characters of the current digest. Returns (the decision, True if it was
    recorded now; False if this digest was approved before).

    Raises:
        StaleDigestError: ``prefix`` is not the current digest (the file changed).
        InputError: the drafting run is not in this ledger.
    """
    shown = os.path.basename(path)
    if len(prefix) < MIN_PREFIX:
        raise InputError(f"digest prefix {prefix!r} is too short to be unambiguous",
                         hint=f"give at least {MIN_PREFIX} characters, e.g. --digest "
                         f"{digest[:12]}")
    if not digest.startswith(prefix.lower()):
        raise StaleDigestError(
            f"digest {prefix} is not the digest of {path} as it is now: {digest} (it was "
            "edited since you looked, or that is another draft's digest)",
            hint=f"review it again (pipeline validate {shown} --plan), then --digest "
            f"{digest[:12]}")
    try:
        store.get_run(header.run, tasks=False)
    except RunNotFoundError:
        raise InputError(f"{path} was drafted in run {header.run}, which is not in the "
                         f"ledger {store.location}",
                         hint="pass --store with the ledger the draft was made in") from None
    try:
        return store.decide(header.run, DRAFT_REQUEST, digest, APPROVED, decider(by),
                            reason), True
    except ApprovalConflictError:
        found = approval(store, header, digest)
        if found is None:
            raise
        return found, False


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it is inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def require_approval(path: str, header: DraftHeader, digest: str, store: Any) -> dict[str, Any]:
    """The approval of the draft's current digest; else raise DraftNotApprovedError."""
    found = approval(store, header, digest)
    if found is not None:
        return found
    path = _shown(path)
    shown = os.path.basename(path)
    try:
        store.get_run(header.run, tasks=False)
    except RunNotFoundError:
        raise DraftNotApprovedError(
            f"{path} is a machine-written draft of run {header.run}, which is not in the "
            f"ledger {store.location}, so no approval of it can be found",
            hint="run it with --store set to the ledger it was drafted (and approved) in"
        ) from None
    hint = (f"review it (pipeline validate {shown} --plan), then: pipeline approve-draft "
            f"{path} --digest {digest[:12]}")
    earlier = approvals(store, header)
    if (header.digest and header.digest != digest) or earlier:
        before = (" (approved before: " + ", ".join(
            f"{d['digest'][:12]} by {d['decided_by']}" for d in earlier) + ")") if earlier else ""
        raise DraftNotApprovedError(
            f"{path} is a machine-written draft that was edited: its digest is now "
            f"{digest[:12]}, drafted as {header.digest[:12] or '?'}{before}; an edited "
            "draft needs a new approval", hint=hint)
    raise DraftNotApprovedError(
        f"{path} is a machine-written draft that has not been approved (digest "
        f"{digest[:12]})", hint=hint)
