"""What an approver sees of a value: rendered, bounded, secrets masked (ledgerflow.approval)."""

from __future__ import annotations

import pytest

from ledgerflow.approval import VALUE_LIMIT, changes, payload_fields, render


def test_secret_named_keys_and_arguments_are_masked() -> None:
    assert render("hunter2", "password") == "***"
    assert render({"user": "ana", "api_key": "k", "nested": [{"token": "t"}]}) == \
        '{"api_key": "***", "nested": [{"token": "***"}], "user": "ana"}'
    assert render("ops", "task_key") == '"ops"'        # a key that is not a secret's


def test_known_key_values_are_masked_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-abcdef0123456789")
    assert render("Bearer sk-abcdef0123456789 sent") == '"Bearer *** sent"'


def test_values_are_bounded() -> None:
    text = render(list(range(10_000)))
    assert len(text) == VALUE_LIMIT and text.endswith("…")


def test_payload_fields_and_what_changed() -> None:
    summary, before = payload_fields('{"amount": 5, "secret": "x", "to": "acme"}')
    assert summary == '{"amount": 5, "secret": "***", "to": "acme"}'
    _, after = payload_fields('{"amount": 7, "secret": "y", "to": "acme"}')
    arg = {f"arg:{k}": v for k, v in before.items()}
    now = {f"arg:{k}": v for k, v in after.items()}
    assert changes(arg, now) == [{"field": "amount", "before": "5", "after": "7"}]
