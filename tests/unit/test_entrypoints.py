"""The entry-point cache (:mod:`ledgerflow.entrypoints`): the answer importlib.metadata
gives, remembered only while the folders and files that decide it are unchanged."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
import types
from pathlib import Path

import pytest

from ledgerflow import entrypoints
from ledgerflow.entrypoints import EntryPoint, entry_points

try:        # (imported before a test's sys.path is only its own folder)
    import importlib_metadata as _BACKPORT
except ImportError:     # pragma: no cover - the dev extras bring it
    _BACKPORT = None

GROUP = "ledgerflow_cache_test"
PAST = time.time() - 3600


def _dist(site: Path, name: str, eps: str) -> Path:
    """A distribution in ``site`` whose entry_points.txt is ``eps`` (``site`` itself
    changed now: :func:`_age` it to make it settled)."""
    info = site / f"{name}-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(eps)
    _age(info / "entry_points.txt", info)
    return info


def _age(*paths: Path) -> None:
    for p in paths:
        os.utime(p, (PAST, PAST))


def _alpha(site: Path) -> Path:
    """The usual case: one distribution (``a = pkg_a``) in ``site``, settled long ago."""
    info = _dist(site, "alpha", f"[{GROUP}]\na = pkg_a\n")
    _age(site)
    return info


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sys.path of one folder, and a cache of this test's own."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.setattr(sys, "path", [str(folder)])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LEDGERFLOW_PLUGIN_CACHE", raising=False)
    return folder


def _cached(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "ledgerflow" / "entry-points").glob("*.json"))


def _pairs(eps: list[EntryPoint]) -> list[tuple[str, str]]:
    return [(ep.name, ep.value) for ep in eps]


def _no_scan(group: str) -> list[tuple[str, str, str | None]]:
    raise AssertionError("the metadata was scanned: the cache did not answer")


def test_the_answer_is_importlib_metadatas_in_its_order(site: Path, tmp_path: Path) -> None:
    _dist(site, "alpha", f"[{GROUP}]\nb = pkg_b\na = pkg_a:attr\n[other]\nx = nope\n")
    _dist(site, "beta", f"[{GROUP}]\nc = pkg_c\n")
    _age(site)
    expected = [(ep.name, ep.value) for ep in importlib.metadata.entry_points(group=GROUP)]
    assert sorted(expected) == [("a", "pkg_a:attr"), ("b", "pkg_b"), ("c", "pkg_c")]
    assert _pairs(entry_points(GROUP)) == expected
    assert len(_cached(tmp_path)) == 1


def test_a_second_process_reads_the_cache_and_scans_nothing(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _alpha(site)
    first = _pairs(entry_points(GROUP))
    monkeypatch.setattr(entrypoints, "_scan", _no_scan)
    assert _pairs(entry_points(GROUP)) == first == [("a", "pkg_a")]


def test_an_installed_distribution_is_seen_at_once(site: Path) -> None:
    _alpha(site)
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    _dist(site, "beta", f"[{GROUP}]\nb = pkg_b\n")      # the folder's mtime moves
    assert sorted(_pairs(entry_points(GROUP))) == [("a", "pkg_a"), ("b", "pkg_b")]


def test_an_uninstalled_distribution_is_gone_at_once(site: Path) -> None:
    _dist(site, "alpha", f"[{GROUP}]\na = pkg_a\n")
    beta = _dist(site, "beta", f"[{GROUP}]\nb = pkg_b\n")
    _age(site)
    assert len(entry_points(GROUP)) == 2
    for f in beta.iterdir():
        f.unlink()
    beta.rmdir()
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]


def test_an_entry_points_file_edited_in_place_is_read_again(site: Path) -> None:
    info = _alpha(site)
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    (info / "entry_points.txt").write_text(f"[{GROUP}]\na = pkg_a2\n")    # folders unchanged
    _age(site, info)
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a2")]


def _clock_at(monkeypatch: pytest.MonkeyPatch, ns: int) -> None:
    """The cache's clock reads ``ns`` (no test depends on how long it takes)."""
    monkeypatch.setattr(entrypoints, "time", types.SimpleNamespace(time_ns=lambda: ns))


def test_a_folder_changed_just_now_is_not_cached(site: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _alpha(site)
    changed = site.stat().st_mtime_ns
    _clock_at(monkeypatch, changed + int((entrypoints.SETTLE_S - 1) * 1e9))
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert _cached(tmp_path) == []
    _clock_at(monkeypatch, changed + int((entrypoints.SETTLE_S + 1) * 1e9))   # settled
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert len(_cached(tmp_path)) == 1


def test_another_sys_path_is_another_answer(site: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _alpha(site)
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    more = tmp_path / "more"
    _dist(more, "beta", f"[{GROUP}]\nb = pkg_b\n")
    _age(more)
    monkeypatch.setattr(sys, "path", [str(site), str(more)])
    assert sorted(_pairs(entry_points(GROUP))) == [("a", "pkg_a"), ("b", "pkg_b")]
    assert len(_cached(tmp_path)) == 2


def test_a_damaged_cache_file_is_ignored_and_replaced(site: Path, tmp_path: Path) -> None:
    _alpha(site)
    entry_points(GROUP)
    (path,) = _cached(tmp_path)
    for damage in (b"{not json", b'{"layout": 1}', b"[]", b'{"layout": 1, "key": 3}'):
        path.write_bytes(damage)
        assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
        assert json.loads(path.read_bytes())["eps"] == [["a", "pkg_a"]]


def test_the_cache_keeps_the_files_written_last(site: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entrypoints, "KEEP", 3)
    _alpha(site)
    for n in range(5):      # five sys.paths, five keys
        extra = tmp_path / f"extra{n}"
        extra.mkdir()
        _age(extra)
        monkeypatch.setattr(sys, "path", [str(site), str(extra)])
        assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
        if n == 1:
            kept = _cached(tmp_path)
            _age(*kept)         # written first: written an hour ago
    files = _cached(tmp_path)
    assert len(files) == 3 and not set(kept) & set(files)
    monkeypatch.setattr(entrypoints, "_scan", _no_scan)       # the last key still answers
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]


def _planted(site: Path, tmp_path: Path) -> Path:
    """The cache file of :func:`_alpha`'s answer, rewritten to name another module."""
    _alpha(site)
    entry_points(GROUP)
    (path,) = _cached(tmp_path)
    doc = json.loads(path.read_bytes())
    doc["eps"] = [["a", "planted_module"]]
    path.write_text(json.dumps(doc))
    return path


def test_a_cache_file_others_may_write_is_not_trusted(site: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the file names modules to import: one anybody could have written is scanned anew
    path = _planted(site, tmp_path)
    path.chmod(0o666)
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert json.loads(path.read_bytes())["eps"] == [["a", "pkg_a"]]     # replaced
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_a_cache_file_another_user_owns_is_not_trusted(site: Path, tmp_path: Path) -> None:
    path = _planted(site, tmp_path)
    os.chown(path, 65534, 65534)        # nobody's, mode 0600
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert path.stat().st_uid == os.geteuid()       # replaced by this user's


def test_the_cache_can_be_turned_off(site: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _alpha(site)
    monkeypatch.setenv("LEDGERFLOW_PLUGIN_CACHE", "0")
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert _cached(tmp_path) == []


def test_an_unwritable_cache_folder_still_answers(site: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _alpha(site)
    (tmp_path / "cache").write_text("a file where the folder would be")
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]


def test_a_finder_of_its_own_distributions_turns_the_cache_off(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Finder:
        def find_spec(self, *args: object) -> None:
            return None

        def find_distributions(self, *args: object) -> list[object]:
            return []

    _alpha(site)
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert _cached(tmp_path) == []


def test_the_importlib_metadata_backports_finder_keeps_the_cache_on(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # importing the backport (OpenTelemetry, Jupyter do) adds its sys.path finder
    if _BACKPORT is None:
        pytest.skip("the importlib_metadata backport is not installed")
    finder = _BACKPORT.MetadataPathFinder()
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    _alpha(site)
    assert _pairs(entry_points(GROUP)) == [("a", "pkg_a")]
    assert len(_cached(tmp_path)) == 1


def test_an_entry_point_loads_its_module_or_attribute() -> None:
    assert EntryPoint("x", "os.path", "g").load() is os.path
    assert EntryPoint("x", "os:path.join", "g").load() is os.path.join
    assert EntryPoint("x", "os:path [extra]", "g").load() is os.path
    with pytest.raises(ModuleNotFoundError):
        EntryPoint("x", "no_such_module_here", "g").load()
