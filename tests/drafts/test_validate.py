"""pipeline validate and spec-schema: every problem as {path, code, message, hint}; exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib
from click.testing import Result

from .conftest import GOOD


def write(project: Path, spec: dict[str, Any], name: str = "spec.json") -> str:
    (project / name).write_text(json.dumps(spec))
    return name


def problems(res: Result) -> set[tuple[str, str]]:
    doc = json.loads(res.stdout)
    for p in doc["problems"]:
        assert set(p) == {"path", "code", "message", "hint"} and p["message"] and p["hint"]
    return {(p["path"], p["code"]) for p in doc["problems"]}


def test_a_valid_spec_exits_0_and_plans_in_order(project: Path, cli: Callable[..., Result]) -> None:
    spec = write(project, GOOD)
    res = cli("validate", spec, "--plan", store=False)
    assert res.exit_code == 0, res.output
    assert "valid (4 step(s))" in res.stdout
    lines = [ln.split()[1] for ln in res.stdout.splitlines() if ln.strip()[:2] in ("1.", "2.",
                                                                                  "3.", "4.")]
    assert lines == ["load", "double", "total", "save"]
    assert "one per item of load" in res.stdout
    doc = json.loads(cli("validate", spec, "--plan", "--json", store=False).stdout)
    assert doc["valid"] and doc["problems"] == [] and not doc["machine_written"]
    assert [r["step"] for r in doc["plan"]] == ["load", "double", "total", "save"]


def test_a_broken_spec_lists_every_problem_with_its_path(project: Path,
                                                         cli: Callable[..., Result]) -> None:
    spec = write(project, {"name": "broken", "tasks": {
        "load": {"task": "steps.py:load", "args": {"rows": "ten"}, "after": ["save"]},
        "double": {"task": "steps.py:dubble", "map": "load"},
        "total": {"task": "steps.py:total", "inputs": {"values": "load", "extra": "nowhere"}},
        "save": {"task": "steps.py:save", "inputs": {"value": "load"}, "after": ["total"],
                 "colour": "red"},
        "agent": {"task": "steps.py:ask_agent"}}})
    res = cli("validate", spec, "--json", "--policy", "POLICY.toml", store=False)
    assert res.exit_code == 2
    found = problems(res)
    assert found >= {
        ("tasks.load.args.rows", "arg.type"),              # a string for an int
        ("tasks.double.task", "task.unknown"),             # a name that does not exist
        ("tasks.total.inputs.extra", "arg.unknown"),       # total has no parameter extra
        ("tasks.total.inputs.extra", "ref.unknown"),       # ... and no step is called nowhere
        ("tasks.save.inputs.value", "input.type"),         # list[int] into value: int
        ("tasks.save.colour", "step.unknown_field"),
        ("tasks.save.args.path", "arg.missing"),
        ("tasks.agent.args.question", "arg.missing"),
        ("tasks.agent", "policy.tool"),                    # the shell tool is not allowed
        ("tasks.agent", "policy.network"),
    }, found
    cycle = [p for p in json.loads(res.stdout)["problems"] if p["code"] == "graph.cycle"]
    assert len(cycle) == 1 and cycle[0]["path"].startswith("tasks.")
    assert "cycle: load -> save -> load" in cycle[0]["message"]
    text = cli("validate", spec, "--policy", "POLICY.toml", store=False)
    assert text.exit_code == 2
    assert "tasks.load.args.rows  [arg.type]" in text.stdout
    assert "did you mean 'steps.py:double'?" in text.stdout


@pytest.mark.parametrize("case, spec, expected", [
    ("cycle", {"tasks": {"a": {"task": "steps.py:load", "args": {"rows": 1}, "after": ["b"]},
                         "b": {"task": "steps.py:load", "args": {"rows": 1}, "after": ["a"]}}},
     {("tasks.a.after[0]", "graph.cycle")}),
    ("unknown task", {"tasks": {"a": {"task": "steps.py:lode", "args": {"rows": 1}},
                                "b": {"task": "nope.module:x"}}},
     {("tasks.a.task", "task.unknown"), ("tasks.b.task", "task.unknown")}),
    ("wrong type", {"tasks": {"a": {"task": "steps.py:load", "args": {"rows": 1.5}},
                              "b": {"task": "steps.py:save",
                                    "args": {"value": True, "path": 3}}}},
     {("tasks.a.args.rows", "arg.type"), ("tasks.b.args.value", "arg.type"),
      ("tasks.b.args.path", "arg.type")}),
    ("forbidden tool", {"tasks": {"a": {"task": "steps.py:ask_agent",
                                        "args": {"question": "what?"}}}},
     {("tasks.a", "policy.tool"), ("tasks.a", "policy.network")}),
])
def test_each_kind_of_problem_exits_2_with_its_path(project: Path, cli: Callable[..., Result],
                                                    case: str, spec: dict[str, Any],
                                                    expected: set[tuple[str, str]]) -> None:
    path = write(project, spec)
    res = cli("validate", path, "--json", "--policy", "POLICY.toml", store=False)
    assert res.exit_code == 2, res.output
    assert problems(res) == expected


def test_cycles_are_all_named(project: Path, cli: Callable[..., Result]) -> None:
    spec = write(project, {"tasks": {
        "a": {"task": "steps.py:double", "map": "b"},
        "b": {"task": "steps.py:load", "args": {"rows": 2}, "after": ["a"]},
        "c": {"task": "steps.py:total", "inputs": {"values": "d"}},
        "d": {"task": "steps.py:load", "args": {"rows": 2}, "after": ["c"]}}})
    res = cli("validate", spec, "--json", store=False)
    messages = sorted(p["message"] for p in json.loads(res.stdout)["problems"]
                      if p["code"] == "graph.cycle")
    assert [m.split(" (")[0] for m in messages] == ["cycle: a -> b -> a", "cycle: c -> d -> c"]


def test_policy_paths_models_and_unchecked_values(project: Path,
                                                  cli: Callable[..., Result]) -> None:
    ok = write(project, GOOD)
    assert cli("validate", ok, "--policy", "POLICY.toml", store=False).exit_code == 0
    outside = json.loads(json.dumps(GOOD))
    outside["tasks"]["save"]["args"]["path"] = "../elsewhere.txt"
    res = cli("validate", write(project, outside, "outside.json"), "--json", "--policy",
              "POLICY.toml", store=False)
    assert problems(res) == {("tasks.save.args.path", "policy.write")}
    fed = json.loads(json.dumps(GOOD))
    fed["tasks"]["name"] = {"task": "steps.py:ask_agent", "args": {"question": "file name?"}}
    fed["tasks"]["save"]["inputs"]["path"] = "name"
    del fed["tasks"]["save"]["args"]
    (project / "P2.toml").write_text('[paths]\nwrite = ["out/"]\n')
    res = cli("validate", write(project, fed, "fed.json"), "--json", "--policy", "P2.toml",
              store=False)
    assert problems(res) == {("tasks.save.inputs.path", "policy.unchecked")}
    (project / "bad.toml").write_text('modles = ["x"]\n')
    res = cli("validate", ok, "--policy", "bad.toml", store=False)
    assert res.exit_code == 2 and "unknown key(s): modles" in res.output


def test_approval_gates_are_notes_and_shown_in_the_plan(project: Path,
                                                        cli: Callable[..., Result]) -> None:
    spec = write(project, {"tasks": {
        "load": {"task": "steps.py:load", "args": {"rows": 3}},
        "total": {"task": "steps.py:total", "inputs": {"values": "load"}},
        "publish": {"task": "steps.py:publish", "inputs": {"value": "total"}}}})
    res = cli("validate", spec, "--plan", "--json", store=False)
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["problems"] == [] and [(n["path"], n["code"]) for n in doc["notes"]] == [
        ("tasks.publish", "approval.required")]
    assert [r["gate"] for r in doc["plan"]] == [False, False, True]
    text = cli("validate", spec, "--plan", store=False).stdout
    assert "3. publish  steps.py:publish; after total; GATE: waits for approval" in text


def test_syntax_errors_are_a_problem_too(project: Path, cli: Callable[..., Result]) -> None:
    (project / "bad.toml").write_text("[tasks.a\n")
    res = cli("validate", "bad.toml", "--json", store=False)
    assert res.exit_code == 2 and problems(res) == {("", "spec.syntax")}
    res = cli("validate", "missing.toml", store=False)
    assert res.exit_code == 2 and res.output.startswith("Error: spec not found")


def test_spec_schema_follows_the_signatures(project: Path, cli: Callable[..., Result]) -> None:
    res = cli("spec-schema", "--tasks", "steps.py", "-o", "schema.json", store=False)
    assert res.exit_code == 0, res.output
    schema = json.loads((project / "schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    step = schema["properties"]["tasks"]["additionalProperties"]
    assert step["properties"]["task"]["enum"] == sorted(
        f"steps.py:{n}" for n in ("load", "double", "total", "save", "show", "ask_agent",
                                  "summarize", "publish"))
    save = schema["$defs"]["steps.py:save"]["properties"]["args"]
    assert save["properties"]["value"]["type"] == "integer"
    assert save["properties"]["path"]["type"] == "string"
    check = jsonschema.Draft202012Validator(schema)
    assert list(check.iter_errors(GOOD)) == []
    bad = json.loads(json.dumps(GOOD))
    bad["tasks"]["load"]["args"]["rows"] = "ten"
    assert any("'ten' is not of type 'integer'" in e.message or e.validator == "oneOf"
               for e in check.iter_errors(bad))
    missing = {"tasks": {"s": {"task": "steps.py:save", "args": {"value": 1}}}}
    assert list(check.iter_errors(missing))          # path is required (args or inputs)
    fed = {"tasks": {"s": {"task": "steps.py:save", "args": {"value": 1},
                           "inputs": {"path": "x"}}}}
    assert list(check.iter_errors(fed)) == []        # ... and may come from a step
    unknown = {"tasks": {"s": {"task": "steps.py:sav"}}}
    assert list(check.iter_errors(unknown))
    toml = tomllib.loads('[tasks.a]\ntask = "steps.py:load"\nargs = { rows = 2 }\n')
    assert list(check.iter_errors(toml)) == []


def test_pipeline_run_of_a_broken_spec_still_exits_2(project: Path,
                                                    cli: Callable[..., Result]) -> None:
    spec = write(project, {"tasks": {"a": {"task": "steps.py:load", "args": {"rows": "x"}}}})
    res = cli("run", spec)
    assert res.exit_code == 2
    assert "tasks.a.args.rows" in res.output and "Hint:" in res.output
    assert not (project / "ledger.duckdb").exists()


def test_a_step_reading_what_another_writes_must_come_after_it(
        project: Path, cli: Callable[..., Result]) -> None:
    spec = json.loads(json.dumps(GOOD))
    spec["tasks"]["show"] = {"task": "steps.py:show", "args": {"path": "out/total.txt"}}
    res = cli("validate", write(project, spec), "--json", store=False)
    assert res.exit_code == 2
    found = json.loads(res.stdout)["problems"]
    assert [(p["path"], p["code"]) for p in found] == [("tasks.show", "graph.race")]
    assert "'out/total.txt', which step 'save' writes" in found[0]["message"]
    assert found[0]["hint"].startswith('add after = ["save"]')
    spec["tasks"]["show"]["after"] = ["save"]
    assert cli("validate", write(project, spec, "ordered.json"), store=False).exit_code == 0


def test_models_keys_budgets_and_programs_against_a_policy(project: Path,
                                                          cli: Callable[..., Result]) -> None:
    (project / "P.toml").write_text('models = ["local"]\nkeys = ["OPENAI_API_KEY"]\n'
                                    'max_budget_usd = 0.5\nprograms = ["pdftotext"]\n'
                                    '[paths]\nwrite = ["out/"]\n')
    spec = {"tasks": {
        "a": {"task": "steps.py:summarize", "args": {"text": "x", "budget": 0.3}},
        "b": {"task": "steps.py:summarize", "args": {"text": "y", "model": "openai:gpt-4o",
                                                     "key": "MY_KEY", "budget": 0.3}},
        "c": {"task": "steps.py:echo", "args": {"text": "hi"}}}}
    res = cli("validate", write(project, spec), "--json", "--policy", "P.toml", store=False)
    assert res.exit_code == 2
    assert problems(res) == {
        ("tasks.b.args.model", "policy.model"),       # openai is not an allowed provider
        ("tasks.b.args.key", "policy.key"),           # nor MY_KEY an allowed key alias
        ("tasks", "policy.budget"),                   # 0.3 + 0.3 > 0.5
        ("tasks.c", "policy.program"),                # echo is not pdftotext
        ("tasks.c", "policy.write"),                  # an unsandboxed program may write anywhere
    }
    # programs are tasks of the catalogue too: their placeholders are their parameters
    res = cli("validate", write(project, {"tasks": {"c": {"task": "steps.py:echo"}}}, "e.json"),
              "--json", store=False)
    assert problems(res) == {("tasks.c.args.text", "arg.missing")}
