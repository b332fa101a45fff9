"""Who decides an approval: the OS user from the kernel, ``--as`` only through a protected
mapping, console tokens per approver (ledgerflow.identity, with the real password database)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from ledgerflow.errors import InputError
from ledgerflow.identity import Verified, decider, from_token, os_user, token_hash


@pytest.fixture
def nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no 'nobody' user")


@pytest.fixture
def mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "approvers"
    monkeypatch.setenv("LEDGERFLOW_APPROVERS", str(path))
    return path


def test_the_default_decider_is_the_os_user_not_the_user_variable(
        nobody: int, mapping: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "ana")
    monkeypatch.setenv("LOGNAME", "ana")
    assert decider(None, uid=nobody) == "nobody"
    assert os_user() == pwd.getpwuid(os.getuid()).pw_name


def test_as_is_refused_without_a_mapping_that_allows_it(nobody: int, mapping: Path) -> None:
    with pytest.raises(InputError, match="OS user 'nobody' may not decide as 'ana'") as exc:
        decider("ana", uid=nobody)
    assert "approvers file" in (exc.value.hint or "")
    assert decider("nobody", uid=nobody) == "nobody"      # naming yourself is fine


def test_the_mapping_names_and_delegates(nobody: int, mapping: Path) -> None:
    mapping.write_text("# OS user: approver name, names it may decide as\n"
                       "nobody: nob, ana\nother: zed\n")
    mapping.chmod(0o644)
    assert decider(None, uid=nobody) == "nob"           # its approver name by default
    assert decider("ana", uid=nobody) == "ana"          # a delegation the mapping gives
    with pytest.raises(InputError):
        decider("zed", uid=nobody)


def test_a_mapping_anyone_could_write_is_ignored(nobody: int, mapping: Path) -> None:
    mapping.write_text("nobody: ana\n")
    mapping.chmod(0o666)
    assert decider(None, uid=nobody) == "nobody"
    with pytest.raises(InputError):
        decider("ana", uid=nobody)


def test_a_verified_name_is_taken_as_it_is(nobody: int, mapping: Path) -> None:
    assert decider(Verified("ana"), uid=nobody) == "ana"


def test_console_tokens_name_their_approver(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ana: {token_hash('s3cret-ana')}\nbob: {token_hash('s3cret-bob')}\n")
    tokens.chmod(0o600)
    monkeypatch.setenv("LEDGERFLOW_APPROVER_TOKENS", str(tokens))
    found = from_token("s3cret-bob")
    assert isinstance(found, Verified) and found == "bob"
    assert from_token("guess") is None and from_token("") is None
