"""Canonical JSON bytes and digests: equal requests hash equal in every process."""

from __future__ import annotations

import hashlib
import json

__all__ = ["canonical_json", "digest"]


def canonical_json(value: object) -> bytes:
    """Return ``value`` as compact UTF-8 JSON with sorted keys.

    Example:
        >>> canonical_json({"b": 1, "a": [1.5, "x"]})
        b'{"a":[1.5,"x"],"b":1}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def digest(value: object) -> str:
    """Return ``sha256:<hex>`` of :func:`canonical_json` of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
