"""SQL derived from the declarations: the group-commit statement and the row encoders.

Records travel as JSON arrays (``msgspec``, the journal's encoding: the
kind's tag, then its fields in declaration order); for each kind the insert
into :attr:`~ledgerflow.records.Record.TABLE` is generated from
:func:`ledgerflow.records.columns` and :func:`~ledgerflow.records.field_types`,
so a field added to a record is a column added here, with no hand-written
list per kind. The current-state rows (``tasks``, ``runs``) come from the
read models :class:`~ledgerflow.views.TaskRow` / :class:`~ledgerflow.views.RunView`
the same way.

A group commit is **one statement** (one round trip, one implicit
transaction): it locks the run's lease row if it still carries the
driver's token, inserts the commit's ``commits`` row (run, token, seq) and,
only if both succeeded, appends every kind's rows and upserts the touched
``tasks`` rows and the ``runs`` row. A stale token writes nothing; a commit
sent again after a lost connection finds its ``commits`` row and writes
nothing.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Final

import msgspec

from ledgerflow.records import KINDS, Record, columns, field_types
from ledgerflow.views import RunView, TaskRow

_encoder = msgspec.json.Encoder()

#: Kinds that append rows, by tag (the others only change a current state).
APPENDED: Final[dict[str, type[Record]]] = {t: k for t, k in KINDS.items() if k.TABLE}

#: ``tasks`` columns in the order :func:`task_rows` encodes them (``key`` is ``task_key``).
TASK_FIELDS: Final[tuple[str, ...]] = tuple(TaskRow.__dataclass_fields__)
TASK_COLUMNS: Final[tuple[str, ...]] = tuple(
    "task_key" if f == "key" else f for f in TASK_FIELDS)
#: The persisted fields of a RunView (its own row; the rest is derived when read).
RUN_FIELDS: Final[tuple[str, ...]] = (
    "run_id", "pipeline", "target", "params", "options", "created_at", "state", "reason",
    "ended_at", "token", "max_seq", "driver_pid", "driver_host")

_task_tuple = attrgetter(*TASK_FIELDS)
_run_tuple = attrgetter(*RUN_FIELDS)


def _unwrap(ann: Any) -> Any:
    if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0]
    return typing.get_origin(ann) or ann


def cast(ann: Any, index: int, src: str = "r") -> str:
    """The SQL reading element ``index`` of the JSON array ``src`` as annotation ``ann``."""
    origin = _unwrap(ann)
    if origin is int:
        return f"({src}->>{index})::bigint"
    if origin is float:
        return f"({src}->>{index})::double precision"
    if origin is list:
        return (f"CASE WHEN json_typeof({src}->{index}) = 'array' THEN ARRAY(SELECT "
                f"json_array_elements_text({src}->{index})) END")
    if origin is dict:
        return f"({src}->{index})::text"        # kept as its JSON text, as in DuckDB
    return f"{src}->>{index}"


def _quoted(cols: Sequence[str]) -> str:
    return ", ".join(f'"{c}"' for c in cols)


def append_cte(tag: str) -> str:
    """The CTE that appends this commit's records of kind ``tag`` to its table."""
    kind = APPENDED[tag]
    cols = columns(kind)
    types_ = field_types(kind)
    values = ", ".join(cast(types_[c], n + 1) for n, c in enumerate(cols))
    token = ', "token"' if kind.TOKENED else ""
    token_v = ", %(token)s" if kind.TOKENED else ""
    return (f"k_{tag} AS (INSERT INTO {kind.TABLE} (run_id, {_quoted(cols)}{token}) "
            f"SELECT c.run_id, {values}{token_v} "
            f"FROM c, json_array_elements(%(k_{tag})s::json) WITH ORDINALITY AS x(r, i) "
            f"ORDER BY x.i)")


def _upsert_cte(name: str, table: str, cols: Sequence[str], hints: dict[str, Any],
                fields: Sequence[str], key: Sequence[str], keep: Sequence[str],
                param: str, extra: Sequence[tuple[str, str]] = ()) -> str:
    values = [cast(hints[f], n) for n, f in enumerate(fields)]
    all_cols = [*cols, *(c for c, _ in extra)]
    all_vals = [*values, *(v for _, v in extra)]
    sets = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in all_cols
                     if c not in key and c not in keep)
    prefix = "run_id, " if "run_id" not in cols else ""
    run_v = "c.run_id, " if prefix else ""
    return (f"{name} AS (INSERT INTO {table} ({prefix}{_quoted(all_cols)}) "
            f"SELECT {run_v}{', '.join(all_vals)} "
            f"FROM c, json_array_elements(%({param})s::json) AS x(r) "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets})")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def commit_sql(tags: frozenset[str], tasks: bool, run: bool) -> str:
    """The one statement of a group commit holding these kinds (see the module docstring).

    Its result row is ``(leased, fresh)``: 1 if the token still holds the
    lease, 1 if this commit had not landed before.
    """
    ctes = [
        "lease AS (SELECT run_id FROM leases WHERE run_id = %(run)s AND token = %(token)s "
        "FOR UPDATE)",
        "c AS (INSERT INTO commits (run_id, token, seq, records) "
        "SELECT run_id, %(token)s, %(seq)s, %(n)s FROM lease "
        "ON CONFLICT DO NOTHING RETURNING run_id)",
    ]
    ctes += [append_cte(t) for t in sorted(tags) if t in APPENDED]
    if tasks:
        task_hints = {("task_key" if f == "key" else f): h
                      for f, h in _hints(TaskRow).items()}
        ctes.append(_upsert_cte(
            "tk", "tasks", TASK_COLUMNS, task_hints, TASK_COLUMNS, ("run_id", "task_key"),
            ("ord",), "tasks", extra=[("ord", f"({'r'}->>{len(TASK_COLUMNS)})::bigint")]))
    if run:
        ctes.append(_upsert_cte("ru", "runs", RUN_FIELDS, _hints(RunView), RUN_FIELDS,
                                ("run_id",), (), "run_row"))
    return ("WITH " + ",\n".join(ctes) +
            "\nSELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM c)")


def commit_params(run_id: str, token: int, seq: int, records: Sequence[Record],
                  tasks: Sequence[tuple[TaskRow, int]], run: RunView | None
                  ) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of one group commit.

    ``tasks``: the touched rows with their creation order; ``run``: the run's
    row if it changed.
    """
    by_tag: dict[str, list[Record]] = {}
    for rec in records:
        tag = rec.__struct_config__.tag
        if tag in APPENDED:
            by_tag.setdefault(tag, []).append(rec)
    params: dict[str, Any] = {"run": run_id, "token": token, "seq": seq, "n": len(records)}
    for tag, recs in by_tag.items():
        params[f"k_{tag}"] = _encoder.encode(recs).decode()
    if tasks:
        params["tasks"] = _encoder.encode([(*_task_tuple(row), ord_)
                                           for row, ord_ in tasks]).decode()
    if run is not None:
        params["run_row"] = _encoder.encode([_run_tuple(run)]).decode()
    sql = commit_sql(frozenset(by_tag), bool(tasks), run is not None)
    return sql, params


def run_tuple(view: RunView) -> tuple[Any, ...]:
    """The persisted fields of ``view`` (to tell whether a commit changed them)."""
    return _run_tuple(view)
