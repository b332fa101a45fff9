"""The README's *The console* path: ``pipeline console`` prints a URL on 127.0.0.1; the runs page
and ``/api/runs/RUN_ID`` (exactly ``pipeline status RUN_ID --json``) over HTTP; Ctrl-C stops it.
And *Observability*'s ``LEDGERFLOW_PROMETHEUS=1 pipeline run flows.py; pipeline console``."""

from __future__ import annotations

import json
import re
import selectors
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from . import cli
from .readme import blocks, commands, section

pytestmark = pytest.mark.subprocess


def _first_line(proc: subprocess.Popen[str], seconds: float = 120) -> str:
    """The first line the console prints (waiting at most ``seconds``)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=0.5):
                return proc.stdout.readline()
    finally:
        sel.close()
    return ""


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.headers["content-type"], resp.read().decode()


def test_console_serves_the_runs_page_and_the_status_document(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(blocks("Ten lines", "python")[0])
    run_cmd = commands(blocks("Ten lines", "bash")[0])[0]
    ran = cli.run(run_cmd, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = cli.run_id(ran.stdout.splitlines()[0])

    console = re.search(r"`(pipeline console)`", section("The console"))
    assert console, "the section shows `pipeline console`"
    argv = [cli.PIPELINE_EXE if w == "pipeline" else w for w in console.group(1).split()]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=cli.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = _first_line(proc)
        m = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert m, (line, proc.poll())
        base = m.group(0)

        kind, page = _get(base)                            # every run
        assert kind.startswith("text/html") and run_id in page
        kind, body = _get(f"{base}api/runs")
        assert kind.startswith("application/json")
        assert run_id in [r["run_id"] for r in json.loads(body)]
        _, body = _get(f"{base}api/runs/{run_id}")
        assert json.loads(body) == cli.json_of(["pipeline", "status", run_id], tmp_path)
    finally:
        proc.send_signal(signal.SIGINT)                    # Ctrl-C
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("the console did not stop within 30 s of a Ctrl-C") from None
    assert proc.returncode in (0, 130), (proc.returncode, err)
    assert "Traceback" not in err, err


@pytest.mark.timeout(600)
def test_prometheus_metrics_of_a_run_are_served_by_the_console(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    m = re.search(r"`LEDGERFLOW_PROMETHEUS=1 (pipeline run flows\.py); (pipeline console)`",
                  section("Observability"))
    assert m, "the Observability section shows the Prometheus line"
    (tmp_path / "flows.py").write_text(blocks("Ten lines", "python")[0])
    ran = cli.run(m.group(1).split(), tmp_path, extra={"LEDGERFLOW_PROMETHEUS": "1"})
    assert ran.returncode == 0, ran.stdout + ran.stderr

    argv = [cli.PIPELINE_EXE if w == "pipeline" else w for w in m.group(2).split()]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=cli.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", _first_line(proc))
        assert url, proc.poll()
        kind, metrics = _get(f"{url.group(0)}metrics")
        assert kind.startswith("text/plain")
        values = dict(line.rsplit(" ", 1) for line in metrics.splitlines()
                      if line and not line.startswith("#"))
        succeeded = '{pipeline="squares",state="succeeded"}'
        assert float(values["ledgerflow_runs_finished_total" + succeeded]) == 1
        # one run of n=10 (its default): fetch and square[0..9] succeeded, ten square attempts
        assert float(values["ledgerflow_task_transitions_total" + succeeded]) == 11, metrics
        assert float(values['ledgerflow_attempt_duration_seconds_count{outcome="ok",'
                            'pipeline="squares",task="square"}']) == 10, metrics
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
