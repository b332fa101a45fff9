"""A draft drafted under a policy is held to it at every run, not only when it was approved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

import ledgerflow
from ledgerflow.specs import drafts

from .conftest import GOOD, POLICY, turn


def test_a_draft_is_checked_against_its_policy_as_it_is_at_run_time(
        project: Path, cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch) -> None:
    res = cli("draft", "sum 1 to 10 into out/total.txt", "--tasks", "steps.py", "-o",
              "draft.toml", "--repairs", "0", "--model", "mock", "--policy", "POLICY.toml",
              turns=[turn(GOOD)])
    assert res.exit_code == 0, res.output
    header = drafts.parse_header((project / "draft.toml").read_text(), None)
    assert header is not None and header.policy == str(project / "POLICY.toml")
    digest = drafts.spec_digest(GOOD)
    assert cli("approve-draft", "draft.toml", "--digest", digest[:12]).exit_code == 0
    ledger = str(project / "ledger.duckdb")
    runs = len(ledgerflow.runs(store=ledger))
    # the policy was tightened after the approval: the run is refused, nothing written
    (project / "POLICY.toml").write_text(POLICY.replace('write = ["out/"]',
                                                        'write = ["elsewhere/"]'))
    res = cli("run", "draft.toml")
    assert res.exit_code == 2, res.output
    assert "tasks.save.args.path" in res.output and "outside what policy" in res.output
    assert not (project / "out" / "total.txt").exists()
    assert len(ledgerflow.runs(store=ledger)) == runs
    # validate says the same without --policy (and --policy still takes its place)
    assert cli("validate", "draft.toml", store=False).exit_code == 2
    (project / "loose.toml").write_text("network = false\n")
    assert cli("validate", "draft.toml", "--policy", "loose.toml", store=False).exit_code == 0
    # as approved: it runs
    (project / "POLICY.toml").write_text(POLICY)
    res = cli("run", "draft.toml")
    assert res.exit_code == 0, res.output
    assert (project / "out" / "total.txt").read_text() == "110"
    # from another folder the relative path is another file, outside the policy: refused
    sub = project / "sub"
    (sub / "out").mkdir(parents=True)
    monkeypatch.chdir(sub)
    res = cli("run", "../draft.toml")
    assert res.exit_code == 2 and "outside what policy" in res.output
    assert not (sub / "out" / "total.txt").exists()
    monkeypatch.chdir(project)
    # a policy that is gone: refused with its path, not run without it
    (project / "POLICY.toml").unlink()
    res = cli("run", "draft.toml")
    assert res.exit_code == 2
    assert f"drafted under policy {project / 'POLICY.toml'}" in res.output
