"""SQL derived from the declarations: the commit and fold statements, the row encoders.

A group commit is **one small statement**: it takes a share lock on the run's
lease row if the row still carries the driver's token, and inserts the
commit's row into ``commits`` keyed by ``(run, token, seq)`` with the
records as written (JSON arrays, the journal's encoding: a kind's tag, then
its fields in declaration order). A stale token writes nothing; a commit
sent again after a lost connection hits its own key and writes nothing.

A **fold** moves a range of commits into the tables, set-based, in one
statement: for each record kind the insert into
:attr:`~ledgerflow.records.Record.TABLE` is generated from
:func:`ledgerflow.records.columns` and :func:`~ledgerflow.records.field_types`
(a field added to a record is a column added here, with no hand-written list
per kind), and the touched ``tasks`` rows and the ``runs`` row, which the
driver computed with :func:`ledgerflow.projection.apply`, are upserted from
the read models :class:`~ledgerflow.views.TaskRow` / :class:`~ledgerflow.views.RunView`
the same way. A fold is fenced by the lease like a commit.

The lease statements of a takeover and of a worker's claim are here too.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, Final

import msgspec

from ledgerflow.records import KINDS, Record, columns, field_types
from ledgerflow.states import RunState, TaskState
from ledgerflow.views import RunView, TaskRow

_encoder = msgspec.json.Encoder()

#: Kinds that append rows, by tag (the others only change a current state).
APPENDED: Final[dict[str, type[Record]]] = {t: k for t, k in KINDS.items() if k.TABLE}

#: ``tasks`` columns in the order :func:`fold_params` encodes them (``key`` is ``task_key``).
TASK_FIELDS: Final[tuple[str, ...]] = tuple(TaskRow.__dataclass_fields__)
TASK_COLUMNS: Final[tuple[str, ...]] = tuple(
    "task_key" if f == "key" else f for f in TASK_FIELDS)
#: The persisted fields of a RunView (its own row; the rest is derived when read).
RUN_FIELDS: Final[tuple[str, ...]] = (
    "run_id", "pipeline", "target", "params", "options", "created_at", "state", "reason",
    "ended_at", "token", "max_seq", "driver_pid", "driver_host")

_task_tuple = attrgetter(*TASK_FIELDS)
_run_tuple = attrgetter(*RUN_FIELDS)

#: The group commit (see the module docstring); returns a row only if it was written.
COMMIT_SQL: Final = (
    "WITH lease AS (SELECT run_id FROM leases WHERE run_id = %(run)s AND token = %(token)s "
    "FOR SHARE) "
    "INSERT INTO commits (run_id, token, seq, records, body) "
    "SELECT run_id, %(token)s, %(seq)s, %(n)s, %(body)s FROM lease "
    "ON CONFLICT DO NOTHING RETURNING 1")


def _unwrap(ann: Any) -> Any:
    if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0]
    return typing.get_origin(ann) or ann


def cast(ann: Any, index: int, src: str = "r") -> str:
    """The SQL reading element ``index`` of the JSONB array ``src`` as annotation ``ann``."""
    origin = _unwrap(ann)
    if origin is bool:
        return f"({src}->>{index})::boolean"
    if origin is int:
        return f"({src}->>{index})::bigint"
    if origin is float:
        return f"({src}->>{index})::double precision"
    if origin is list:
        return (f"CASE WHEN jsonb_typeof({src}->{index}) = 'array' THEN ARRAY(SELECT "
                f"jsonb_array_elements_text({src}->{index})) END")
    if origin is dict:
        return f"({src}->{index})::text"        # kept as its JSON text, as in DuckDB
    return f"{src}->>{index}"


def _quoted(cols: Sequence[str]) -> str:
    return ", ".join(f'"{c}"' for c in cols)


def append_cte(tag: str) -> str:
    """The CTE that appends the folded commits' records of kind ``tag`` to its table."""
    kind = APPENDED[tag]
    cols = columns(kind)
    types_ = field_types(kind)
    values = ", ".join(cast(types_[c], n + 1) for n, c in enumerate(cols))
    token = ', "token"' if kind.TOKENED else ""
    token_v = ", token" if kind.TOKENED else ""
    return (f"k_{tag} AS (INSERT INTO {kind.TABLE} (run_id, {_quoted(cols)}{token}) "
            f"SELECT run_id, {values}{token_v} FROM raw WHERE r->>0 = '{tag}' "
            f"ORDER BY token, seq, i)")


def _upsert_cte(name: str, table: str, cols: Sequence[str], hints: dict[str, Any],
                key: Sequence[str], keep: Sequence[str], param: str,
                extra: Sequence[tuple[str, str]] = ()) -> str:
    values = [cast(hints[c], n) for n, c in enumerate(cols)]
    all_cols = [*cols, *(c for c, _ in extra)]
    all_vals = [*values, *(v for _, v in extra)]
    sets = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in all_cols
                     if c not in key and c not in keep)
    prefix = "run_id, " if "run_id" not in cols else ""
    run_v = "%(run)s, " if prefix else ""
    return (f"{name} AS (INSERT INTO {table} ({prefix}{_quoted(all_cols)}) "
            f"SELECT {run_v}{', '.join(all_vals)} "
            f"FROM gate, jsonb_array_elements(%({param})s::jsonb) AS x(r) "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets})")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def fold_sql(tasks: bool, run: bool) -> str:
    """The one statement of a fold of commits ``(ft, fs) < (token, seq) <= (tt, ts)``.

    Its result is 1 if it was applied: the lease is still the driver's and the
    run is folded up to exactly ``(ft, fs)``; else nothing is written.
    """
    ctes = [
        "lease AS (SELECT run_id FROM leases WHERE run_id = %(run)s AND token = %(token)s "
        "FOR SHARE)",
        # compare-and-set on the fold position: a fold sent again (its outcome unknown
        # after a lost connection) or raced finds it moved and writes nothing
        "gate AS (SELECT f.run_id FROM folds f, lease WHERE f.run_id = %(run)s "
        "AND f.token = %(ft)s AND f.seq = %(fs)s FOR UPDATE OF f)",
        "raw AS MATERIALIZED (SELECT c.run_id, c.token, c.seq, x.i, x.r "
        "FROM gate, commits c, jsonb_array_elements(c.body::jsonb) WITH ORDINALITY AS x(r, i) "
        # row comparisons on a prefix of the primary key: an index range scan
        "WHERE c.run_id = %(run)s AND (c.run_id, c.token, c.seq) > (%(run)s, %(ft)s, %(fs)s) "
        "AND (c.run_id, c.token, c.seq) <= (%(run)s, %(tt)s, %(ts)s))",
    ]
    ctes += [append_cte(t) for t in sorted(APPENDED)]
    if tasks:
        task_hints = {("task_key" if f == "key" else f): h
                      for f, h in _hints(TaskRow).items()}
        ctes.append(_upsert_cte(
            "tk", "tasks", TASK_COLUMNS, task_hints, ("run_id", "task_key"), ("ord",),
            "tasks", extra=[("ord", f"(r->>{len(TASK_COLUMNS)})::bigint")]))
    if run:
        ctes.append(_upsert_cte("ru", "runs", RUN_FIELDS, _hints(RunView), ("run_id",), (),
                                "run_row"))
    ctes.append("fo AS (UPDATE folds f SET token = %(tt)s, seq = %(ts)s, at = now() "
                "FROM gate WHERE f.run_id = gate.run_id)")
    return "WITH " + ",\n".join(ctes) + "\nSELECT count(*) FROM gate"


def commit_params(run_id: str, token: int, seq: int, body: bytes, n: int) -> dict[str, Any]:
    """The parameters of :data:`COMMIT_SQL` (``body``: the records as one JSON array)."""
    return {"run": run_id, "token": token, "seq": seq, "n": n, "body": body.decode()}


def fold_params(run_id: str, token: int, start: tuple[int, int], end: tuple[int, int],
                tasks: Iterable[tuple[TaskRow, int]], run: RunView | None
                ) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of one fold.

    ``tasks``: the rows the folded commits touched, as of ``end``, with their
    creation order (-1: kept from before); ``run``: the run's row if it changed.
    """
    rows = [(*_task_tuple(row), ord_) for row, ord_ in tasks]
    params: dict[str, Any] = {"run": run_id, "token": token, "ft": start[0], "fs": start[1],
                              "tt": end[0], "ts": end[1]}
    if rows:
        params["tasks"] = _encoder.encode(rows).decode()
    if run is not None:
        params["run_row"] = _encoder.encode([_run_tuple(run)]).decode()
    return fold_sql(bool(rows), run is not None), params


def run_tuple(view: RunView) -> tuple[Any, ...]:
    """The persisted fields of ``view`` (to tell whether a commit changed them)."""
    return _run_tuple(view)


#: A run's lease row, locked, with whether it expired and how long it has left.
LEASE_FOR_UPDATE_SQL: Final = (
    "SELECT token, pid, host, pid_start, expires_at <= now(), "
    "extract(epoch FROM expires_at - now()) FROM leases WHERE run_id = %s FOR UPDATE")

#: A takeover: (token, pid, host, pid start, ttl seconds, run id).
TAKE_OVER_SQL: Final = (
    "UPDATE leases SET token = %s, pid = %s, host = %s, pid_start = %s, "
    "acquired_at = now(), renewed_at = now(), "
    "expires_at = now() + make_interval(secs => %s) WHERE run_id = %s")

#: The unexpired leases of active runs held on a host (whose holder may be dead).
HELD_ON_HOST_SQL: Final = (
    "SELECT l.run_id, l.pid, l.pid_start FROM leases l JOIN runs r USING (run_id) "
    "WHERE r.state = ANY(%s) AND l.expires_at > now() AND l.host = %s")

_WAITING_RUN: Final = RunState.WAITING.value
_WAITING_TASK: Final = TaskState.WAITING_APPROVAL.value

#: A ``waiting`` run (of ``runs r``) that a drive would move on: commits not folded yet
#: (the tables may be behind), no task left in ``waiting_approval``, or a waiting task
#: whose current (latest) request is decided (a ``signals`` decision from any process,
#: or a journaled one) or past its deadline (``gates.Gates.poll`` applies the rule).
#: Without one of these a drive finds nothing to do: a worker does not claim it.
WAITING_DUE: Final = (
    "(EXISTS (SELECT 1 FROM commits c WHERE c.run_id = r.run_id "
    "AND (c.run_id, c.token, c.seq) > (r.run_id, "
    "coalesce((SELECT f.token FROM folds f WHERE f.run_id = r.run_id), 0), "
    "coalesce((SELECT f.seq FROM folds f WHERE f.run_id = r.run_id), 0))) "
    "OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.run_id "
    f"AND t.state = '{_WAITING_TASK}') "
    "OR EXISTS (SELECT 1 FROM tasks t CROSS JOIN LATERAL (SELECT a.digest, a.deadline "
    "FROM approval_requests a WHERE a.run_id = t.run_id AND a.task_key = t.task_key "
    "ORDER BY a.id DESC LIMIT 1) q WHERE t.run_id = r.run_id "
    f"AND t.state = '{_WAITING_TASK}' AND (q.deadline <= extract(epoch FROM now()) "
    "OR EXISTS (SELECT 1 FROM signals s WHERE s.run_id = r.run_id "
    "AND s.kind = 'decision' AND s.digest = q.digest) "
    "OR EXISTS (SELECT 1 FROM approval_decisions d WHERE d.run_id = r.run_id "
    "AND d.task_key = t.task_key AND d.digest = q.digest))))")

#: A worker's claim of the oldest claimable run waiting for a driver (named parameters):
#: submitted, or active with an expired lease or a holder gone (``dead``: 'run/pid/start'
#: of same-host holders not alive, taken over at once, unchanged since), and not
#: ``waiting`` unless :data:`WAITING_DUE` (a run that waits for a person never blocks the
#: newer ones: the oldest claimable one goes first). It returns the run, the new token
#: and the pid of a holder taken over before its lease expired (else NULL).
CLAIM_SQL: Final = (
    "WITH cand AS (SELECT l.run_id, CASE WHEN l.expires_at > now() THEN l.pid END AS dead "
    "FROM leases l JOIN runs r USING (run_id) "
    "WHERE r.state = ANY(%(active)s) AND (l.expires_at <= now() OR "
    "l.run_id || '/' || coalesce(l.pid, 0) || '/' || coalesce(l.pid_start, '') "
    "= ANY(%(dead)s)) "
    f"AND NOT (l.run_id = ANY(%(skip)s)) AND (r.state <> '{_WAITING_RUN}' OR {WAITING_DUE}) "
    "ORDER BY r.created_at, r.run_id LIMIT 1 "
    "FOR UPDATE OF l SKIP LOCKED) "
    "UPDATE leases l SET token = l.token + 1, pid = %(pid)s, host = %(host)s, "
    "pid_start = %(start)s, acquired_at = now(), renewed_at = now(), "
    "expires_at = now() + make_interval(secs => %(ttl)s) FROM cand "
    "WHERE l.run_id = cand.run_id RETURNING l.run_id, l.token, cand.dead")
