"""The physical floor of a durable trivial task, built from first principles.

What any durable engine must do per task, and nothing else: a ready-count
scheduler (graphlib's idea: a task is ready when its count of unfinished
upstreams is zero), a blake2b fingerprint of its inputs, the call, a blake2b
hash of its result, one msgspec record appended to a buffer, and one
``write`` + ``fsync`` of the buffer per 4,096 tasks (what makes it durable).
ledgerflow's per-task figure divided by this one says how far the engine is
from the floor on the same machine, in the same run (``python -m tests.perf``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections import deque

import msgspec

#: Tasks a write + fsync covers (the group commit of the floor).
BATCH = 4096


class _Done(msgspec.Struct, array_like=True, tag="D"):
    key: int
    fingerprint: str
    result_hash: str
    result: int


def _noop(x: int) -> int:
    return x


def floor_us(shape: str, n: int) -> float:
    """Microseconds a task for ``n`` tasks of ``shape`` (``chain`` or ``fan-out``)."""
    ups: list[tuple[int, ...]] = ([()] + [(i - 1,) for i in range(1, n)] if shape == "chain"
                                  else [()] * n)
    downs: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(u) for u in ups]
    for i, u in enumerate(ups):
        for j in u:
            downs[j].append(i)
    enc = msgspec.msgpack.Encoder()
    blake = hashlib.blake2b
    fd, path = tempfile.mkstemp(prefix="lf-perf-floor-")
    try:
        t = time.perf_counter()
        results: list[int] = [0] * n
        hashes: list[str] = [""] * n
        ready = deque(i for i in range(n) if waiting[i] == 0)
        buf = bytearray()
        pending = 0
        while ready:
            i = ready.popleft()
            args = [results[j] for j in ups[i]] or [i if shape == "fan-out" else 0]
            fp = blake(repr((i, args, [hashes[j] for j in ups[i]])).encode(),
                       digest_size=16).hexdigest()
            value = _noop(args[0])
            h = blake(enc.encode(value), digest_size=16).hexdigest()
            results[i], hashes[i] = value, h
            buf += enc.encode(_Done(i, fp, h, value))
            pending += 1
            if pending == BATCH:
                os.write(fd, buf)
                os.fsync(fd)
                buf.clear()
                pending = 0
            for d in downs[i]:
                waiting[d] -= 1
                if waiting[d] == 0:
                    ready.append(d)
        if buf:
            os.write(fd, buf)
            os.fsync(fd)
        return (time.perf_counter() - t) / n * 1e6
    finally:
        os.close(fd)
        os.unlink(path)
