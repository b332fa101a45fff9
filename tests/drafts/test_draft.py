"""pipeline draft with the mock model: drafts validated and repaired, refused until approved."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import ledgerflow
from ledgerflow.specs import drafts

from .conftest import GOOD, turn

REQUEST = "double the numbers 1 to 10, add them up and save the total to out/total.txt"


def draft(cli: Callable[..., Result], *turns: dict[str, Any], repairs: int = 0,
          output: str = "draft.toml", policy: bool = True) -> Result:
    args = ["draft", REQUEST, "--tasks", "steps.py", "-o", output, "--repairs", str(repairs),
            "--model", "mock"]
    if policy:
        args += ["--policy", "POLICY.toml"]
    return cli(*args, turns=list(turns))


def variant(**changes: Any) -> dict[str, Any]:
    """GOOD with some steps replaced (None: removed)."""
    doc = json.loads(json.dumps(GOOD))
    for key, step in changes.items():
        if step is None:
            del doc["tasks"][key]
        else:
            doc["tasks"][key] = step
    return doc


BROKEN = {
    "cycle": (variant(load={"task": "steps.py:load", "args": {"rows": 10}, "after": ["save"]}),
              {("tasks.double.map", "graph.cycle")}),
    "unknown task": (variant(double={"task": "steps.py:tripple", "map": "load"}),
                     {("tasks.double.task", "task.unknown")}),
    "wrong argument type": (variant(load={"task": "steps.py:load", "args": {"rows": "ten"}}),
                            {("tasks.load.args.rows", "arg.type")}),
    "forbidden tool": (variant(ask={"task": "steps.py:ask_agent", "args": {"question": "sum?"}}),
                       {("tasks.ask", "policy.tool"), ("tasks.ask", "policy.network")}),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_draft_exits_2_and_lists_every_problem(case: str, project: Path,
                                                         cli: Callable[..., Result]) -> None:
    spec, expected = BROKEN[case]
    res = draft(cli, turn(spec))
    assert res.exit_code == 2, res.output
    for path, code in expected:
        assert f"{path}  [{code}]" in res.stdout
    # written anyway (to fix by hand), marked machine-written; validate says the same
    text = (project / "draft.toml").read_text()
    assert text.startswith(drafts.MARK) and f"draft-problems: {len(expected)}" in text
    res = cli("validate", "draft.toml", "--policy", "POLICY.toml", "--json", store=False)
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert {(p["path"], p["code"]) for p in doc["problems"]} == expected
    assert doc["machine_written"] is True


def test_a_valid_draft_runs_only_once_its_digest_is_approved(project: Path,
                                                           cli: Callable[..., Result]) -> None:
    res = draft(cli, turn(GOOD))
    assert res.exit_code == 0, res.output
    text = (project / "draft.toml").read_text()
    assert text.startswith("# ledgerflow draft: machine-written")
    header = drafts.parse_header(text, None)
    assert header is not None and header.request == REQUEST and header.model == "mock"
    digest = drafts.spec_digest(json.loads(json.dumps(GOOD)))
    assert header.digest == digest and f"--digest {digest[:12]}" in res.stdout
    # refused: exit 2 with the digest, and no run is recorded
    before = [r.run_id for r in ledgerflow.runs(store=str(project / "ledger.duckdb"))]
    assert before == [header.run]
    res = cli("run", "draft.toml")
    assert res.exit_code == 2
    assert "has not been approved" in res.output and f"--digest {digest[:12]}" in res.output
    assert not (project / "out" / "total.txt").exists()
    assert [r.run_id for r in ledgerflow.runs(store=str(project / "ledger.duckdb"))] == before
    # the Python API is refused too
    with pytest.raises(drafts.DraftNotApprovedError):
        ledgerflow.run("draft.toml", store=str(project / "ledger.duckdb"), executor="inline")
    # a wrong or short digest does not approve it
    assert cli("approve-draft", "draft.toml", "--digest", "0123456789ab").exit_code == 2
    assert cli("approve-draft", "draft.toml", "--digest", digest[:4]).exit_code == 2
    # the drafting run's gates are not how a draft is approved: the error says what is
    res = cli("approve", header.run, drafts.DRAFT_REQUEST, "--digest", digest[:12])
    assert res.exit_code == 2 and "pipeline approve-draft FILE" in res.output
    res = cli("approve-draft", "draft.toml", "--digest", digest[:12], "--as", "ana",
              "--reason", "checked the path")
    assert res.exit_code == 0, res.output
    assert "approved: digest" in res.stdout and "by ana" in res.stdout
    # who and when are in the ledger, on the drafting run
    made = ledgerflow.get_run(header.run, store=str(project / "ledger.duckdb")).store \
        .approval_decisions(header.run)
    assert [(d["task_key"], d["digest"], d["decided_by"], d["reason"]) for d in made] == [
        (drafts.DRAFT_REQUEST, digest, "ana", "checked the path")]
    assert made[0]["decided_at"] > 0
    assert "already approved" in cli("approve-draft", "draft.toml", "--digest",
                                     digest[:12]).stdout
    res = cli("run", "draft.toml")
    assert res.exit_code == 0, res.output
    assert (project / "out" / "total.txt").read_text() == "110"
    # an edited draft needs a new approval
    (project / "draft.toml").write_text(text.replace("rows = 10", "rows = 4"))
    res = cli("run", "draft.toml")
    assert res.exit_code == 2 and "was edited" in res.output
    new = drafts.spec_digest(variant(load={"task": "steps.py:load", "args": {"rows": 4}}))
    assert f"--digest {new[:12]}" in res.output
    assert cli("approve-draft", "draft.toml", "--digest", digest[:12]).exit_code == 2
    assert cli("approve-draft", "draft.toml", "--digest", new[:12]).exit_code == 0
    assert cli("run", "draft.toml").exit_code == 0
    assert (project / "out" / "total.txt").read_text() == "20"
    # comments and formatting are not content: the approval still holds
    edited = (project / "draft.toml").read_text().replace("[tasks.total]", "# ok\n[tasks.total]")
    (project / "draft.toml").write_text(edited)
    assert cli("run", "draft.toml").exit_code == 0


def test_the_repair_loop_turns_a_broken_draft_into_a_valid_one(
        project: Path, cli: Callable[..., Result]) -> None:
    broken = variant(load={"task": "steps.py:load", "args": {"rows": "ten"}, "after": ["save"]},
                     double={"task": "steps.py:dubble", "map": "load"})
    res = draft(cli, turn(broken), turn(GOOD), repairs=2)
    assert res.exit_code == 0, res.output
    assert "round 1: 3 problem(s) -> sent back for a repair" in res.stdout
    assert "round 2: valid" in res.stdout
    assert drafts.parse_header((project / "draft.toml").read_text(), None).digest == \
        drafts.spec_digest(GOOD)
    # the drafting run holds both model calls, both checks and what was sent back
    run_id = drafts.parse_header((project / "draft.toml").read_text(), None).run
    run = ledgerflow.get_run(run_id, store=str(project / "ledger.duckdb"))
    calls = run.model_calls()
    assert [c["seq"] for c in calls] == [1, 2] and all(c["task_key"] == "draft_spec"
                                                       for c in calls)
    assert [c["tool_calls"] for c in calls] == [["write_spec"], ["write_spec"]]
    assert calls[0]["input_tokens"] == 500 and calls[1]["output_tokens"] == 80
    assert [t["outcome"] for t in run.tool_calls()] == ["problems", "ok"]
    assert run.usage()["totals"]["model_calls"] == 2
    result = run.result()
    fed_back = result["rounds"][0]["problems"]
    assert {(p["path"], p["code"]) for p in fed_back} == {
        ("tasks.load.args.rows", "arg.type"), ("tasks.double.task", "task.unknown"),
        ("tasks.double.map", "graph.cycle")}


def test_the_model_sees_the_problems_it_must_repair(project: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The repair request holds the validator's objects as the tool's result."""
    import ledgerflow_agents
    from ledgerflow_agents import MockModel
    from ledgerflow_drafts.agent import draft_spec

    mock = MockModel(turns=[turn(variant(load={"task": "steps.py:load",
                                               "args": {"rows": "ten"}})), turn(GOOD)])
    monkeypatch.setattr(ledgerflow_agents, "get_model", lambda name, options=None: mock)
    out = draft_spec.fn("sum", ["steps.py"], str(project), "mock", None, 1)
    assert out["valid"] and len(out["rounds"]) == 2
    second = mock.requests[1]["request"]
    tool_msg = second["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["name"] == "write_spec"
    sent = json.loads(tool_msg["content"])
    assert sent["problems"] == [{"path": "tasks.load.args.rows", "code": "arg.type",
                                 "message": sent["problems"][0]["message"],
                                 "hint": "give rows as an integer, e.g. 10"}]
    assert second["tools"][0]["name"] == "write_spec" and second["tool_choice"] == "write_spec"


def test_a_draft_that_stays_broken_is_written_with_its_problems(
        project: Path, cli: Callable[..., Result]) -> None:
    broken = variant(load={"task": "steps.py:load", "args": {"rows": "ten"}})
    res = draft(cli, turn(broken), turn(broken), repairs=1)
    assert res.exit_code == 2
    assert "1 problem(s) remain after 1 repair(s)" in res.stdout
    assert "draft-problems: 1" in (project / "draft.toml").read_text()
    assert cli("approve-draft", "draft.toml", "--digest",
               drafts.spec_digest(broken)[:12]).exit_code == 2


def test_a_json_draft_and_a_model_the_policy_forbids(project: Path,
                                                     cli: Callable[..., Result]) -> None:
    res = draft(cli, turn(GOOD), output="draft.json")
    assert res.exit_code == 0, res.output
    doc = json.loads((project / "draft.json").read_text())
    assert doc[drafts.JSON_KEY]["machine_written"] is True
    digest = doc[drafts.JSON_KEY]["digest"]
    assert digest == drafts.spec_digest(doc)
    assert cli("run", "draft.json").exit_code == 2
    assert cli("approve-draft", "draft.json", "--digest", digest[:8]).exit_code == 0
    assert cli("run", "draft.json").exit_code == 0
    (project / "P.toml").write_text('models = ["local"]\n')
    res = cli("draft", REQUEST, "--tasks", "steps.py", "-o", "d2.toml", "--policy", "P.toml",
              turns=[turn(GOOD)])
    assert res.exit_code == 2 and "does not allow the model 'mock'" in res.output
    assert not (project / "d2.toml").exists()


def test_without_its_header_a_draft_is_a_hand_written_spec(project: Path,
                                                           cli: Callable[..., Result]) -> None:
    assert draft(cli, turn(GOOD)).exit_code == 0
    body = (project / "draft.toml").read_text().split("\n\n", 1)[1]
    (project / "mine.toml").write_text(body)
    res = cli("approve-draft", "mine.toml", "--digest", "abcdef")
    assert res.exit_code == 2 and "not a machine-written draft" in res.output
    assert cli("run", "mine.toml").exit_code == 0


def test_a_resume_of_an_edited_draft_is_refused(project: Path,
                                                cli: Callable[..., Result]) -> None:
    flaky = variant(save={"task": "steps.py:save", "inputs": {"value": "total"},
                          "args": {"path": "out/missing/total.txt"}})
    assert draft(cli, turn(flaky)).exit_code == 0
    digest = drafts.spec_digest(flaky)
    assert cli("approve-draft", "draft.toml", "--digest", digest[:12]).exit_code == 0
    res = cli("run", "draft.toml", "--json")
    assert res.exit_code == 1                          # out/missing/ does not exist
    run_id = json.loads(res.stdout)["run_id"]
    text = (project / "draft.toml").read_text()
    (project / "draft.toml").write_text(text.replace("out/missing/total.txt", "out/t.txt"))
    res = cli("resume", run_id)
    assert res.exit_code == 2 and "was edited" in res.output
    new = drafts.spec_digest(variant(save={"task": "steps.py:save", "inputs": {"value": "total"},
                                           "args": {"path": "out/t.txt"}}))
    assert cli("approve-draft", "draft.toml", "--digest", new[:12]).exit_code == 0
    assert cli("resume", run_id).exit_code == 0
    assert (project / "out" / "t.txt").read_text() == "110"


def test_a_draft_naming_a_task_outside_the_catalogue_imports_nothing(
        project: Path, cli: Callable[..., Result]) -> None:
    (project / "side_effect.py").write_text(
        "open('imported.txt', 'w').write('x')\nfrom ledgerflow import task\n"
        "@task\ndef x() -> int:\n    return 1\n")
    spec = variant(extra={"task": "side_effect.py:x"})
    res = draft(cli, turn(spec))
    assert res.exit_code == 2
    assert "tasks.extra.task  [task.unknown]" in res.stdout
    assert "not one of the tasks this draft may use" in res.stdout
    assert not (project / "imported.txt").exists()


def test_a_submitted_draft_needs_its_approval_too(project: Path,
                                                 cli: Callable[..., Result]) -> None:
    """pipeline submit records a run for a worker: an unapproved draft is refused first."""
    assert draft(cli, turn(GOOD)).exit_code == 0
    ledger = str(project / "ledger.duckdb")
    before = [r.run_id for r in ledgerflow.runs(store=ledger)]
    res = cli("submit", "draft.toml", "--json")
    assert res.exit_code == 2 and "has not been approved" in res.output
    assert [r.run_id for r in ledgerflow.runs(store=ledger)] == before
    digest = drafts.spec_digest(GOOD)
    assert cli("approve-draft", "draft.toml", "--digest", digest[:12]).exit_code == 0
    res = cli("submit", "draft.toml", "--json")
    assert res.exit_code == 0, res.output
    run_id = json.loads(res.stdout)["run_id"]
    # edited before a worker (here: resume) drives it: refused until approved again
    text = (project / "draft.toml").read_text()
    (project / "draft.toml").write_text(text.replace("rows = 10", "rows = 3"))
    res = cli("resume", run_id)
    assert res.exit_code == 2 and "was edited" in res.output
    assert not (project / "out" / "total.txt").exists()
    (project / "draft.toml").write_text(text)
    assert cli("resume", run_id).exit_code == 0
    assert (project / "out" / "total.txt").read_text() == "110"


def test_failed_model_calls_are_in_the_ledger_too(project: Path,
                                                  cli: Callable[..., Result]) -> None:
    """A call that spent tokens but gave no usable answer is recorded, with why."""
    bad = {"fault": "malformed", "usage": {"input_tokens": 500, "output_tokens": 900}}
    # the first answer fails twice (the attempt and its retry): the drafting run fails
    res = draft(cli, bad, bad)
    assert res.exit_code == 1, res.output
    assert not (project / "draft.toml").exists()
    (run,) = ledgerflow.runs(store=str(project / "ledger.duckdb"))
    calls = ledgerflow.get_run(run.run_id, store=str(project / "ledger.duckdb")).model_calls()
    assert [(c["attempt"], c["output_tokens"], c["finish_reason"]) for c in calls] == [
        (1, 900, "error: MalformedResponse"), (2, 900, "error: MalformedResponse")]
    # a repair that fails: the draft is written as it was, and the failed call is counted
    broken = variant(load={"task": "steps.py:load", "args": {"rows": "ten"}})
    res = draft(cli, turn(broken), bad, repairs=1, output="second.toml")
    assert res.exit_code == 2, res.output
    run_id = drafts.parse_header((project / "second.toml").read_text(), None).run
    usage = ledgerflow.get_run(run_id, store=str(project / "ledger.duckdb")).usage()
    assert usage["totals"]["model_calls"] == 2 and usage["totals"]["output_tokens"] == 980
