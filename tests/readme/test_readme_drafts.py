"""The README's *Drafts* lines in order, in a folder holding docs/drafts-example (steps.py,
POLICY.toml): ``pipeline draft`` (on the mock model replaying the example's script; as written,
on the local model, marked ``local_model``), ``validate --plan``, ``approve-draft``, ``run``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from . import cli
from .readme import blocks, commands

pytestmark = pytest.mark.subprocess

SECTION = "Drafts: validated specs, and model-written ones"
EXAMPLE = cli.ROOT / "docs" / "drafts-example"


def _lines() -> list[list[str]]:
    draft, validate, approve, run = commands(blocks(SECTION, "")[0])
    assert (draft[1], validate[1], approve[1], run[1]) == ("draft", "validate", "approve-draft",
                                                           "run")
    return [draft, validate, approve, run]


def _folder(tmp_path: Path) -> Path:
    for name in ("steps.py", "POLICY.toml", "mock-script.json"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    (tmp_path / "out").mkdir()
    return tmp_path


def _digest(draft: Path) -> str:
    m = re.search(r"^# draft-digest: ([0-9a-f]{12})", draft.read_text(), re.M)
    assert m, draft.read_text()
    return m.group(1)


def test_a_draft_is_validated_approved_by_digest_and_run(tmp_path: Path) -> None:
    here = _folder(tmp_path)
    draft, validate, approve, run = _lines()
    model = draft.index("--model")
    draft = [*draft[:model + 1], "mock", *draft[model + 2:]]      # the example's scripted model
    made = cli.run(draft, here, extra={"LEDGERFLOW_MOCK_MODEL": "mock-script.json"})
    assert made.returncode == 0, made.stdout + made.stderr
    text = (here / "draft.toml").read_text()
    assert text.startswith("# ledgerflow draft: machine-written")
    digest = _digest(here / "draft.toml")

    planned = cli.run(validate, here)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    for step in ("load", "double", "total", "save"):
        assert step in planned.stdout

    refused = cli.run(run, here)                                  # not approved yet
    assert refused.returncode == 2 and f"--digest {digest}" in refused.stderr + refused.stdout
    assert not (here / "out" / "total.txt").exists()

    at = approve.index("--digest")                                # the README's digest is an example
    approved = cli.run([*approve[:at + 1], digest, *approve[at + 2:]], here)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    ran = cli.run(run, here)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (here / "out" / "total.txt").read_text() == "110"     # 2 + 4 + ... + 20


@pytest.mark.slow
@pytest.mark.local_model
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not cli.local_model(), reason="local model not installed; run ./dev setup")
def test_the_draft_line_as_written_on_the_local_model(tmp_path: Path) -> None:
    """The local model's draft always fits the schema (README: 7 of 10 validate): it is written
    with its header, and ``validate`` gives the same verdict as ``draft`` did."""
    here = _folder(tmp_path)
    draft, validate, _, _ = _lines()
    assert draft[draft.index("--model") + 1] == "local"
    made = cli.run(draft, here, timeout=1100)
    assert made.returncode in (0, 2), made.stdout + made.stderr
    assert "Traceback" not in made.stderr
    assert (here / "draft.toml").read_text().startswith("# ledgerflow draft: machine-written")
    checked = cli.run(validate, here)
    assert checked.returncode == made.returncode, checked.stdout + checked.stderr
