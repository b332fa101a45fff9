"""A ledger written by a newer ledgerflow is refused by doctor and repair, and left as it is.

Both the DuckDB file's schema version and a journal's record format (its driver
header) count: doctor says "written by a newer ledgerflow" with the fix (upgrade),
repair refuses with exit 2 instead of rebuilding it with what this release knows.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

FLOW = """
from ledgerflow import pipeline, task

@task
def one() -> int:
    return 1

@pipeline
def flow():
    return one()
"""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[str, dict[str, str]]:
    (tmp_path / "flow.py").write_text(FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    store = str(tmp_path / "ledger.duckdb")
    assert _cli("run", str(tmp_path / "flow.py"), "--store", store, env=env).returncode == 0
    return store, env


def _digest(store: str) -> str:
    """The bytes of the ledger file and every file of its folder."""
    h = hashlib.sha256()
    for p in sorted([Path(store), *Path(store + ".d").rglob("*")]):
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def _refused(store: str, env: dict[str, str], why: str) -> None:
    before = _digest(store)
    doctor = _cli("doctor", "--store", store, env=env)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert "written by a newer ledgerflow" in doctor.stdout and why in doctor.stdout
    assert "upgrade ledgerflow" in doctor.stdout
    repair = _cli("repair", "--store", store, env=env)
    assert repair.returncode == 2, repair.stdout + repair.stderr
    first = repair.stderr.splitlines()[0]
    assert "written by a newer ledgerflow" in first and "nothing was changed" in first
    assert "upgrade ledgerflow" in repair.stderr
    assert _digest(store) == before
    assert not list(Path(store).parent.glob("*.broken-*"))


def test_a_newer_schema_version_is_refused_by_doctor_and_repair(ledger) -> None:
    import duckdb
    store, env = ledger
    con = duckdb.connect(store)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    _refused(store, env, "schema version 99")


def test_a_journal_of_a_newer_record_format_is_refused_by_doctor_and_repair(ledger) -> None:
    store, env = ledger
    now = time.time()
    rid = "20991231-000000-abcdef"
    body = json.dumps([["D", rid, "flow", None, "{}", now, "{}"],
                       ["H", 1, 4242, "another-host", now, 99],
                       ["S", "running", "", now]], separators=(",", ":")).encode()
    segment = Path(store + ".d") / "journals" / f"{rid}.1.jsonl"
    segment.write_bytes(body + b"\t%08x\n" % zlib.crc32(body))
    _refused(store, env, f"journal {segment.name}")
