"""Reusing a committed result: a dispatch's fingerprint, its cache lookup and ``verify=``.

The runner asks :class:`Cache` before an attempt: it returns the hit to
reuse (or None) and why a hit was rejected, and records nothing; the runner
applies the hit (``ResultRecorded`` and ``ready -> succeeded``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .keys import fingerprint_base, finish_fingerprint

if TYPE_CHECKING:
    from .plan import Instance, Plan
    from .store import CacheHit, RunStore


class Cache:
    """The committed results of other runs a drive may reuse, by fingerprint."""

    __slots__ = ("bases", "hits", "store")

    def __init__(self, hits: Mapping[str, CacheHit], store: RunStore) -> None:
        self.hits = hits
        self.store = store
        self.bases: dict[Any, Any] = {}        # task -> its fingerprint's fixed part

    def fingerprint(self, plan: Plan, inst: Instance, args: tuple[Any, ...],
                    kwargs: dict[str, Any], ups: Any) -> tuple[str, bytes]:
        """The task's fingerprint and literal bytes: code version, literal arguments
        (and what the task adds, ``_extra_fingerprint``), upstream result hashes."""
        task = inst.node.task
        extra = task._extra_fingerprint(args, kwargs)   # must not raise
        base = self.bases.get(task)
        if base is None:
            base = self.bases[task] = fingerprint_base(task.name, task.version)
        literals = plan.literal_bytes(inst)
        if extra:
            literals += b"\x00" + extra
        return finish_fingerprint(base, literals, ups), literals

    def lookup(self, inst: Instance, fp: str, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[CacheHit | None, str]:
        """The hit to reuse for ``fp`` (None: run the task) and why one was rejected."""
        hit = self.hits.get(fp)
        if hit is None:
            return None, ""
        if hit[5] is not None and not self.store.blob_exists(hit[5]):
            return None, ""         # its result file is gone: run the task instead
        verify = inst.node.task.options.verify
        if verify is not None:
            rejected = self.verify(verify, inst, hit, args, kwargs)
            if rejected:
                return None, rejected
        return hit, ""

    def verify(self, verify: Callable[..., object], inst: Instance, hit: CacheHit,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Check a cache hit of a task with ``verify=``; return why it was rejected, or "".

        Runs in the driver, with the cached result and the task's resolved
        arguments. Only True accepts; False or an exception rejects (the task
        then runs, and the reason lands in the ``running`` transition).
        """
        src_run, src_key, _, kind, data, uri, _ = hit
        where = f"{src_run}/{src_key}"
        try:
            value = self.store.read_blob(kind, data, uri)
            ok = verify(value, *args, **kwargs)
        except BaseException as exc:  # user code (sys.exit too): a failing check = "not verified"
            return f"; cache hit rejected by verify: {type(exc).__name__}: {exc} ({where})"
        if ok is True:
            inst.value = value      # read once: dependents use it as it is
            return ""
        name = getattr(verify, "__qualname__", repr(verify))
        return f"; cache hit rejected by verify: {name} returned {ok!r} ({where})"
