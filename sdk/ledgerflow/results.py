"""Serialising task results: Arrow-shaped values columnar, JSON, else pickle.

``encode`` runs where the task ran (a worker thread or process); stores
decide where the bytes live. Kinds: ``json`` (text), ``arrow`` (Arrow IPC
bytes; stores write Parquet), ``pickle`` (bytes).
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from typing import Any

from .keys import digest

_NONE_HASH = digest(b"null")


@dataclass(slots=True, frozen=True)
class Encoded:
    """A result in its stored form plus its content hash."""

    kind: str
    data: bytes
    hash: str

    @property
    def size(self) -> int:
        return len(self.data)


NONE = Encoded("json", b"null", _NONE_HASH)


def _is_arrow(value: object) -> bool:
    mod = type(value).__module__
    return mod.startswith(("pyarrow", "pandas", "polars"))


def encode(value: object) -> Encoded:
    """Serialise ``value``; deterministic for JSON and Arrow values."""
    if value is None:
        return NONE
    t = type(value)
    if t is int:
        data = int.__repr__(value).encode()
        return Encoded("json", data, digest(data))
    if t is str or t is float or t is bool:
        data = json.dumps(value).encode()
        return Encoded("json", data, digest(data))
    if _is_arrow(value):
        table = _to_arrow(value)
        if table is not None:
            import pyarrow as pa
            sink = io.BytesIO()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            data = sink.getvalue()
            return Encoded("arrow", data, digest(data))
    try:
        data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        if json.loads(data) == value:   # tuples, int-keyed dicts... do not round-trip
            return Encoded("json", data, digest(data))
    except (TypeError, ValueError):
        pass
    try:
        data = pickle.dumps(value, protocol=5)
    except Exception:
        import cloudpickle  # what pickle refuses (a lambda, a local class): rare
        data = cloudpickle.dumps(value, protocol=5)
    return Encoded("pickle", data, digest(data))


def _to_arrow(value: object) -> Any:
    import pyarrow as pa
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    mod = type(value).__module__
    if mod.startswith("pandas") and type(value).__name__ == "DataFrame":
        return pa.Table.from_pandas(value, preserve_index=False)
    if mod.startswith("polars") and type(value).__name__ == "DataFrame":
        return value.to_arrow()  # type: ignore[attr-defined]
    return None


def decode(kind: str, data: bytes) -> Any:
    """Turn stored bytes back into a value (Arrow kinds come back as pyarrow.Table)."""
    if kind == "json":
        return json.loads(data)
    if kind == "arrow":
        import pyarrow as pa
        return pa.ipc.open_stream(data).read_all()
    if kind == "pickle":
        return pickle.loads(data)
    raise ValueError(f"unknown result kind {kind!r}")
