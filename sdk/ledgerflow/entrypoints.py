"""Entry points of a group, remembered between processes while the installed packages stay.

Finding the ``ledgerflow`` entry points means importing :mod:`importlib.metadata`
and reading the metadata of every installed distribution: 30-50 ms a process
on a virtualenv of 160 packages, more than the rest of ``pipeline status``'s
plugin loading. :func:`entry_points` keeps what one scan found in a small file
under the user's cache folder (``$XDG_CACHE_HOME/ledgerflow/entry-points``, else
``~/.cache/ledgerflow/entry-points``; a file another user owns or may write is not
read), and uses it only while nothing that decides the
answer has changed. That is the rule Python's own import system caches
directory listings by (a folder's mtime changes when an entry is added or
removed), applied to:

* the interpreter, and ``sys.path`` as it is (a new ``PYTHONPATH`` is another key);
* the mtime of every ``sys.path`` folder: installing, upgrading or removing a
  distribution adds or removes its ``*.dist-info`` there;
* the mtime of each ``entry_points.txt`` the answer came from (an edit in place).

A folder changed in the last two seconds is not trusted to have settled (its next
change could carry the same mtime), so nothing is written then. A finder on
``sys.meta_path`` that answers for distributions itself (not the standard path
finder) turns the cache off, as does ``LEDGERFLOW_PLUGIN_CACHE=0``. A cache file
that cannot be read, or is not what this module wrote, is ignored and replaced.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: The version of the cache file's layout (a file of another is ignored).
LAYOUT = 1
#: How recent a folder's change may be for its mtime to be trusted.
SETTLE_S = 2.0
#: Cache files kept (one per interpreter, ``sys.path`` and group): the least recently
#: written go when a write passes it (test suites and scripts make many keys).
KEEP = 64


class EntryPoint:
    """One entry point: ``name = value`` in ``group``, where value is ``module[:attr]``."""

    __slots__ = ("group", "name", "value")

    def __init__(self, name: str, value: str, group: str) -> None:
        self.name, self.value, self.group = name, value, group

    def load(self) -> Any:
        """Import the module the value names and return it (or its attribute)."""
        spec = self.value.split("[", 1)[0].strip()     # extras do not change what loads
        module, _, attrs = spec.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for attr in filter(None, attrs.strip().split(".")):
            obj = getattr(obj, attr)
        return obj

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` of the installed distributions, in the order
    :func:`importlib.metadata.entry_points` gives them; from the cache when it holds."""
    folder = _cache_folder()
    if folder is None:
        return [EntryPoint(n, v, group) for n, v, _src in _scan(group)]
    key, newest = _key(group)
    path = folder / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.json"
    cached = _read(path, key)
    if cached is not None:
        return [EntryPoint(n, v, group) for n, v in cached]
    found = _scan(group)
    sources = sorted({src for _n, _v, src in found if src})
    stamps = [_mtime(src) for src in sources]
    newest = max([newest, *(s for s in stamps if s is not None)])
    if time.time_ns() - newest >= SETTLE_S * 1e9:
        _write(folder, path, {"layout": LAYOUT, "key": key, "sources": sources,
                              "stamps": stamps, "eps": [[n, v] for n, v, _s in found]})
    return [EntryPoint(n, v, group) for n, v, _src in found]


def _cache_folder() -> Path | None:
    """Where the cache files live, or None when the cache is off."""
    if os.environ.get("LEDGERFLOW_PLUGIN_CACHE", "1").strip().lower() in ("0", "off", "no",
                                                                           "false"):
        return None
    if any(_own_distributions(f) for f in sys.meta_path):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if home == "~" or not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "ledgerflow" / "entry-points"


#: Finders that find distributions on ``sys.path`` as the standard one does: the path
#: finder, and the ``importlib_metadata`` backport's, which importing it adds (as
#: OpenTelemetry and Jupyter do), and its copy vendored in setuptools.
_PATH_FINDERS = {("_frozen_importlib_external", "PathFinder"),
                 ("importlib.machinery", "PathFinder"),
                 ("importlib._bootstrap_external", "PathFinder"),
                 ("importlib_metadata", "MetadataPathFinder"),
                 ("setuptools._vendor.importlib_metadata", "MetadataPathFinder")}


def _own_distributions(finder: object) -> bool:
    """True if ``finder`` answers ``find_distributions`` with code of its own (not a
    search of ``sys.path``, which the cache's key covers)."""
    if getattr(finder, "find_distributions", None) is None:
        return False
    cls = finder if isinstance(finder, type) else type(finder)
    return (cls.__module__, cls.__qualname__) not in _PATH_FINDERS


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _key(group: str) -> tuple[str, int]:
    """What decides the answer for ``group`` (as text), and the newest mtime in it."""
    stamps = [_mtime(p or ".") for p in sys.path]
    newest = max((s for s in stamps if s is not None), default=0)
    key = json.dumps([LAYOUT, group, sys.executable, sys.version, sys.path, stamps])
    return key, newest


def _read(path: Path, key: str) -> list[tuple[str, str]] | None:
    """The cached entry points, if the file is this key's and its sources are unchanged."""
    try:
        with open(path, "rb") as fh:
            if not _own_file(os.fstat(fh.fileno())):
                return None     # another user's file: its module names are not trusted
            doc = json.loads(fh.read())
        if doc["layout"] != LAYOUT or doc["key"] != key:
            return None
        if [_mtime(src) for src in doc["sources"]] != doc["stamps"]:
            return None
        return [(str(n), str(v)) for n, v in doc["eps"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _own_file(st: os.stat_result) -> bool:
    """True if the file is this user's and only this user may write it."""
    getuid = getattr(os, "getuid", None)
    return getuid is None or (st.st_uid == getuid() and not st.st_mode & 0o022)


def _write(folder: Path, path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` with ``doc`` atomically; a cache that cannot be written is skipped."""
    import tempfile  # (3 ms of imports: only when a scan is written)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ep-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        _prune(folder)
    except OSError:
        return


def _prune(folder: Path) -> None:
    """Remove the least recently written cache files beyond :data:`KEEP`."""
    files = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".json"):
            try:
                files.append((entry.stat().st_mtime_ns, entry.path))
            except OSError:
                continue
    for _mtime_ns, path in sorted(files, reverse=True)[KEEP:]:
        try:
            os.unlink(path)
        except OSError:
            pass


def _scan(group: str) -> list[tuple[str, str, str | None]]:
    """Each (name, value, the entry_points.txt it is in) of ``group``, from the metadata."""
    from importlib import metadata
    found = []
    for ep in metadata.entry_points(group=group):
        dist = getattr(ep, "dist", None)
        where = getattr(dist, "_path", None)       # a PathDistribution's *.dist-info
        src = None if where is None else os.path.join(str(where), "entry_points.txt")
        found.append((ep.name, ep.value, src))
    return found
