"""The README's *A shared PostgreSQL ledger* lines on a real server (tests/postgres/pgserver.py):
``LEDGERFLOW_STORE`` and ``LEDGERFLOW_BLOB_DIR`` exported, ``pipeline submit flows.py -p n=100``
records the run, ``pipeline worker`` drives it. The worker line's Dask cluster is replaced by
the default executor (``--max-runs 1`` so it returns): Dask has tests of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerflow
from tests.postgres.pgserver import PgServer, missing_reason

from . import cli
from .readme import blocks, commands

pytestmark = [pytest.mark.subprocess, pytest.mark.postgres]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PgServer()
    server.start()
    yield server
    server.destroy()


def test_submit_on_one_machine_a_worker_drives_it(tmp_path: Path, pg: PgServer) -> None:
    (block,) = blocks("A shared PostgreSQL ledger", "bash")
    exports = [line.split()[1].split("=", 1)[0] for line in block.splitlines()
               if line.startswith("export ")]
    assert exports == ["LEDGERFLOW_STORE", "LEDGERFLOW_BLOB_DIR"]
    submit, worker = commands(block)
    assert submit[:3] == ["pipeline", "submit", "flows.py"] and worker[1] == "worker"
    store = pg.create_schema("readme")
    extra = {"LEDGERFLOW_STORE": store, "LEDGERFLOW_BLOB_DIR": str(tmp_path / "shared")}
    (tmp_path / "flows.py").write_text(blocks("Ten lines", "python")[0])

    submitted = cli.run(submit, tmp_path, extra=extra)                   # machine A
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    run_id = cli.run_id(submitted.stdout)
    status = cli.run(["pipeline", "status", run_id, "--json"], tmp_path, extra=extra)
    assert status.returncode == 0 and '"state": "submitted"' in status.stdout, status.stdout

    worked = cli.run(["pipeline", "worker", "--max-runs", "1", "--exit-idle", "60"], tmp_path,
                     extra=extra)                                        # machine B
    assert worked.returncode == 0, worked.stdout + worked.stderr
    run = ledgerflow.get_run(run_id, store=store)
    assert run.state == "succeeded"
    assert run.result() == [i * i for i in range(100)]
