"""The journal schema: one typed declaration per record kind, and its encoding.

The runner hands stores *records* in group commits. Each kind is a
``msgspec.Struct`` encoded as a JSON array whose first element is the kind's
one-letter tag (``["E", 12, "embed[a.md]", 1, "ready", "running", "", 1.7e9]``),
so a journal line is one array of such arrays. Field names are the column
names of the SQL table each kind appends to (:attr:`Record.TABLE`), so a
store can derive its inserts from these declarations.

Format versions. Version 1 (the first release) wrote the same arrays from
plain tuples; version 2 adds the trailing ``format`` field of
:class:`DriverHeader`. Version 3 writes *outcome records*: what happened to a
task in as few records as the meaning allows. A :class:`TaskCreated` with a
``seq`` also says the task went ``pending``; a :class:`TaskCreated` or
:class:`Transition` with a ``then_state`` also carries the task's next move
(``seq + 1``); a :class:`Succeeded` is an attempt that ended ok, its result
and the task's success in one. Version 4 lets a :class:`Succeeded` also carry the
dispatch before it (``run_ts``: ``ready -> running`` as move ``seq - 1``; ``ready_ts``:
``pending -> ready`` as move ``seq - 2`` before that), the one or two moves an in-driver
attempt's dispatch made within the commit lag. Those extra fields (:attr:`Record.COMPACT`)
are no table columns: :func:`expand` turns a v3 line into the v2 records it
stands for, and :func:`decode_line` returns them expanded, so readers see one
shape (the DuckDB fold expands in SQL; the store contract suite keeps the
two equal). A field added later goes at the end of its kind with a default,
so lines written by an older release still decode. Decoding a newer kind or
a malformed line raises :class:`msgspec.ValidationError` /
:class:`msgspec.DecodeError` (callers report it as a damaged journal).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final, Union

import msgspec

#: The record format this release writes (see the module docstring).
FORMAT_VERSION: Final = 4


class Record(msgspec.Struct, array_like=True, gc=False):
    """Base of every journal record (never written itself)."""

    #: The table whose rows this kind appends (None: it only changes a current state).
    TABLE: ClassVar[str | None] = None
    #: True if the table also keeps the fencing token of the writer.
    TOKENED: ClassVar[bool] = False
    #: Trailing fields that are no table column (format 3's compact moves: expanded
    #: into records of their own when read, see :func:`expand`).
    COMPACT: ClassVar[tuple[str, ...]] = ()


class RunDefined(Record, tag="D"):
    """A run was created: what it runs and with which parameters."""

    run_id: str
    pipeline: str
    target: str | None
    params: str
    created_at: float
    options: str


class DriverHeader(Record, tag="H"):
    """A driver took the run's lease (creation or takeover)."""

    token: int
    pid: int
    host: str
    at: float
    format: int = 1


class RunStateChanged(Record, tag="S"):
    """The run moved to ``state``."""

    state: str
    reason: str
    at: float


class TaskCreated(Record, tag="T"):
    """A task instance exists (a call, or one child of a fan-out).

    Format 3: ``seq`` > 0 says it went ``pending`` at ``at`` as move ``seq``, and
    a ``then_state`` is its next move (``seq + 1``, see :class:`Transition`).
    """

    COMPACT = ("seq", "then_state", "then_attempt", "then_reason", "then_ts")

    task_key: str
    task_name: str
    node: str
    item_key: str | None
    position: int | None
    upstream: list[str]
    code_version: str
    at: float
    seq: int = 0
    then_state: str | None = None
    then_attempt: int = 0
    then_reason: str = ""
    then_ts: float = 0.0


class Transition(Record, tag="E"):
    """A task moved from ``from_state`` (None: created) to ``to_state``.

    Format 3: a ``then_state`` says the task moved on from ``to_state`` to it right
    after, as move ``seq + 1`` (attempt ``then_attempt``, at ``then_ts``).
    """

    TABLE = "events"
    TOKENED = True
    COMPACT = ("then_state", "then_attempt", "then_reason", "then_ts")

    seq: int
    task_key: str
    attempt: int
    from_state: str | None
    to_state: str
    reason: str
    ts: float
    then_state: str | None = None
    then_attempt: int = 0
    then_reason: str = ""
    then_ts: float = 0.0


class AttemptEnded(Record, tag="A"):
    """One attempt ended with ``outcome`` (ok, error, timeout, cancelled, lost)."""

    TABLE = "attempts"
    TOKENED = True

    task_key: str
    attempt: int
    outcome: str
    started_at: float | None
    ended_at: float | None
    error_type: str
    error_message: str
    traceback: str


class ResultRecorded(Record, tag="R"):
    """A task's result was committed (``cached_from``: reused from that run)."""

    TABLE = "results"

    task_key: str
    attempt: int
    fingerprint: str | None
    content_hash: str
    kind: str
    data: str | None
    uri: str | None
    size: int
    cached_from: str | None


class Succeeded(Record, tag="O"):
    """Format 3: an attempt ended ``ok`` with its result, and its task went from running
    to succeeded as move ``seq`` at ``ts``: the :class:`AttemptEnded`, the
    :class:`ResultRecorded` and the :class:`Transition` it stands for (:func:`expand`).

    Format 4: with ``run_ts``, the dispatch of the attempt too: ``ready -> running``
    (reason ``attempt N``) as move ``seq - 1`` at ``run_ts``, and with ``ready_ts``
    ``pending -> ready`` (attempt ``N - 1``, no reason) as move ``seq - 2`` before it.
    """

    COMPACT = ("run_ts", "ready_ts")

    seq: int
    task_key: str
    attempt: int
    started_at: float | None
    ended_at: float | None
    fingerprint: str | None
    content_hash: str
    kind: str
    data: str | None
    uri: str | None
    size: int
    ts: float
    run_ts: float | None = None
    ready_ts: float | None = None


class ArtifactRecorded(Record, tag="L"):
    """A task attempt read or wrote an outside artifact (lineage)."""

    TABLE = "artifacts"

    task_key: str
    attempt: int
    direction: str
    uri: str
    content_hash: str | None
    attrs: dict[str, str]


class Notice(Record, tag="N"):
    """Something worth telling a user that is not a transition (a late result...)."""

    TABLE = "notices"

    task_key: str | None
    attempt: int | None
    kind: str
    message: str
    ts: float


class LogRecorded(Record, tag="G"):
    """What one attempt wrote (stdout, stderr and ``logging``), capped head and tail.

    ``dropped`` is how many bytes were cut from the middle.
    """

    TABLE = "logs"
    TOKENED = True

    task_key: str
    attempt: int
    stream: str
    text: str
    dropped: int


class ApprovalRequested(Record, tag="P"):
    """A gate asks a person: what (action, summary, input hashes), bound to ``digest``.

    ``deadline``: epoch seconds (None: none); ``on_timeout``: ``fail`` or ``reject``.
    """

    TABLE = "approval_requests"

    task_key: str
    attempt: int
    digest: str
    action: str
    summary: str
    inputs: dict[str, str]
    requested_at: float
    deadline: float | None
    on_timeout: str
    approvers: list[str]
    note: str


class ApprovalDecided(Record, tag="Q"):
    """A decision on the request ``digest``: approved, rejected or expired."""

    TABLE = "approval_decisions"

    task_key: str
    digest: str
    decision: str
    decided_by: str
    reason: str
    decided_at: float


class StepRecorded(Record, tag="X"):
    """The result of a step a task recorded (``context().step``): a re-run of the task
    (after an approval, a retry, a resume) gets it back instead of doing the step again."""

    TABLE = "steps"

    task_key: str
    attempt: int
    name: str
    kind: str
    data: str
    content_hash: str


class ModelCall(Record, tag="M"):
    """One call to a model: who, what it cost, what was reserved for it, its digests.

    ``content`` holds the prompt and response text only when the task asked to
    record content (``record_content=True``); else it is empty.
    """

    TABLE = "model_calls"

    task_key: str
    attempt: int
    seq: int
    provider: str
    model: str
    key_alias: str
    request_hash: str
    response_hash: str
    input_tokens: int
    output_tokens: int
    cost: float
    latency: float
    finish_reason: str
    tool_calls: list[str]
    reserved_tokens: int
    reserved_cost: float
    replayed: bool
    content: str


class ToolCall(Record, tag="U"):
    """One call of a tool by an agent: which tool, a digest of its arguments, who
    approved it, how it ended and a hash of its result."""

    TABLE = "tool_calls"

    task_key: str
    attempt: int
    seq: int
    tool: str
    arguments_digest: str
    approved_by: str
    outcome: str
    result_hash: str
    error: str
    replayed: bool


class Takeover(Record, tag="K"):
    """Written by a store when a new driver takes a run over: the previous driver's
    segment (``from_token``) counts up to byte ``from_offset``; what it wrote after
    that is a superseded driver's and is never applied (``pipeline repair`` reads it)."""

    from_token: int
    from_offset: int
    at: float


AnyRecord = Union[RunDefined, DriverHeader, RunStateChanged, TaskCreated, Transition,  # noqa: UP007
                  AttemptEnded, ResultRecorded, Succeeded, ArtifactRecorded, Notice,
                  LogRecorded, ApprovalRequested, ApprovalDecided, StepRecorded, ModelCall,
                  ToolCall, Takeover]

#: Every record kind, by tag.
KINDS: Final[dict[str, type[Record]]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (RunDefined, DriverHeader, RunStateChanged, TaskCreated, Transition,
                AttemptEnded, ResultRecorded, Succeeded, ArtifactRecorded, Notice,
                LogRecorded, ApprovalRequested, ApprovalDecided, StepRecorded, ModelCall,
                ToolCall, Takeover)}

#: Kinds that describe the run itself (no task rows needed to apply them).
RUN_KINDS: Final[tuple[type[Record], ...]] = (RunDefined, DriverHeader, RunStateChanged)

_encoder = msgspec.json.Encoder()
_line_decoder = msgspec.json.Decoder(list[AnyRecord])
_record_decoder = msgspec.json.Decoder(AnyRecord)


def encode_line(records: Sequence[Record]) -> bytes:
    """One journal line: the records as a JSON array of arrays, plus a newline."""
    buf = bytearray()
    _encoder.encode_into(records, buf)
    buf += b"\n"
    return bytes(buf)


def decode_line(line: bytes) -> list[AnyRecord]:
    """The records of one journal line, expanded (raises msgspec errors when damaged)."""
    return expand(_line_decoder.decode(line))  # type: ignore[return-value]


_PENDING, _READY, _RUNNING = "pending", "ready", "running"
_OK, _SUCCEEDED = "ok", "succeeded"


def expand(records: Sequence[Record]) -> list[Record]:
    """``records`` with format 3's outcome records replaced by the records they stand
    for (a new list; the others are kept as they are)."""
    out: list[Record] = []
    add = out.append
    for r in records:
        t = type(r)
        if t is Transition:
            e: Transition = r  # type: ignore[assignment]
            if e.then_state is None:
                add(e)
                continue
            add(Transition(e.seq, e.task_key, e.attempt, e.from_state, e.to_state, e.reason,
                           e.ts))
            add(Transition(e.seq + 1, e.task_key, e.then_attempt, e.to_state, e.then_state,
                           e.then_reason, e.then_ts))
        elif t is TaskCreated:
            c: TaskCreated = r  # type: ignore[assignment]
            if not c.seq:
                add(c)
                continue
            add(TaskCreated(c.task_key, c.task_name, c.node, c.item_key, c.position,
                            c.upstream, c.code_version, c.at))
            add(Transition(c.seq, c.task_key, 0, None, _PENDING, "", c.at))
            if c.then_state is not None:
                add(Transition(c.seq + 1, c.task_key, c.then_attempt, _PENDING, c.then_state,
                               c.then_reason, c.then_ts))
        elif t is Succeeded:
            s: Succeeded = r  # type: ignore[assignment]
            if s.run_ts is not None:
                out.extend(dispatch_moves(s))
            add(AttemptEnded(s.task_key, s.attempt, _OK, s.started_at, s.ended_at, "", "", ""))
            add(ResultRecorded(s.task_key, s.attempt, s.fingerprint, s.content_hash, s.kind,
                               s.data, s.uri, s.size, None))
            add(Transition(s.seq, s.task_key, s.attempt, _RUNNING, _SUCCEEDED, "", s.ts))
        else:
            add(r)
    return out


def dispatch_moves(s: Succeeded) -> list[Transition]:
    """The moves of the dispatch a format-4 :class:`Succeeded` carries (``run_ts``), in
    order: ``pending -> ready`` (with ``ready_ts``), then ``ready -> running``."""
    moves = []
    if s.ready_ts is not None:
        moves.append(Transition(s.seq - 2, s.task_key, s.attempt - 1, _PENDING, _READY, "",
                                s.ready_ts))
    if s.run_ts is not None:
        moves.append(Transition(s.seq - 1, s.task_key, s.attempt, _READY, _RUNNING,
                                f"attempt {s.attempt}", s.run_ts))
    return moves


def encode(record: Record) -> bytes:
    """One record as JSON."""
    return _encoder.encode(record)


def decode(data: bytes) -> AnyRecord:
    """One record from JSON."""
    return _record_decoder.decode(data)


def tag(record: Record) -> str:
    """The one-letter kind of ``record``."""
    return record.__struct_config__.tag  # type: ignore[return-value]


def columns(kind: type[Record]) -> tuple[str, ...]:
    """The field names of ``kind`` that are table columns, in their encoded order (after
    the tag; the :attr:`~Record.COMPACT` fields after them are not)."""
    fields = kind.__struct_fields__
    return fields[:len(fields) - len(kind.COMPACT)] if kind.COMPACT else fields


def field_types(kind: type[Record]) -> dict[str, Any]:
    """The annotation of each field of ``kind`` (for stores deriving SQL types)."""
    import typing
    hints = typing.get_type_hints(kind)
    return {name: hints[name] for name in kind.__struct_fields__}
