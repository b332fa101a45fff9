"""Two ``pipeline resume RUN`` processes started at once on the PostgreSQL store: exactly
one drives, the other refuses (the DuckDB test: tests/integration/test_resume_race.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerflow import pipeline, task
from tests.integration.test_resume_race import FLOW, one_drove

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess]


def _failed_run(tmp: Path, store: str) -> tuple[str, dict[str, str]]:
    (tmp / "flow.py").write_text(FLOW)
    side = tmp / "side"
    side.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(SIDE=str(side), PYTHONUNBUFFERED="1", LEDGERFLOW_BLOB_DIR=str(tmp / "blobs"))
    first = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(tmp / "flow.py"),
                            "--store", store], capture_output=True, text=True, env=env,
                           timeout=120)
    assert first.returncode == 1, first.stderr
    run_id = first.stdout.split()[1]
    (side / "fixed").write_text("")
    return run_id, env


@pytest.mark.parametrize("round_", range(4))
def test_of_two_resumes_at_once_one_drives_and_the_other_refuses(
        tmp_path: Path, pg_url: str, round_: int) -> None:
    run_id, env = _failed_run(tmp_path, pg_url)
    one_drove(tmp_path, run_id, pg_url, env)


@task
def counted(side: str) -> int:
    with Path(side).open("a") as fh:
        fh.write("x\n")
    if not Path(side + ".fixed").exists():
        raise RuntimeError("not yet")
    return 1


@pipeline
def once(side: str):
    return counted(side)


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_a_resume_from_a_read_another_resume_made_stale_is_refused(
        tmp_path: Path, pg_url: str, kind: str) -> None:
    """This process reads the failed run; another resumes it to success meanwhile; a
    resume from the stale read is refused and does not run the task again."""
    import ledgerflow
    from ledgerflow.errors import NotResumableError
    from ledgerflow_postgres import PostgresStore
    from ledgerflow_stores.duckdb import DuckDBStore

    where = pg_url if kind == "postgres" else str(tmp_path / "l.duckdb")
    side = str(tmp_path / "side")
    run = once.run(side=side, store=where, executor="inline")
    assert run.state == "failed"
    mine = PostgresStore(where) if kind == "postgres" else DuckDBStore(where)
    try:
        stale = mine.get_run(run.run_id, upstream=False)
        Path(side + ".fixed").touch()
        done = ledgerflow.resume(run.run_id, store=where, executor="inline")
        assert done.state == "succeeded"
        with pytest.raises(NotResumableError, match="is being resumed by pid"):
            ledgerflow.resume(run.run_id, store=mine, executor="inline", view=stale,
                              pipeline=once)
    finally:
        mine.close()
    assert Path(side).read_text().count("x") == 2        # the failed try and one resume
