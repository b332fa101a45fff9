"""Issue 31 #3: a provider's usage is checked, so a malformed answer is an error, never a credit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerflow import context, pipeline, task
from ledgerflow.errors import DefinitionError
from ledgerflow_agents import (
    Budget,
    BudgetExceeded,
    MalformedResponse,
    MockModel,
    Pricing,
)
from ledgerflow_agents.provider import MAX_CALL_TOKENS, Usage

PROMPT = "x" * 2400      # about 807 tokens by the byte estimate, so each call costs 907


@pytest.mark.parametrize("bad", [-10_000, -1, 1.5, "12", True, None, MAX_CALL_TOKENS + 1])
def test_a_usage_count_that_is_not_a_whole_non_negative_number_is_malformed(bad: Any) -> None:
    with pytest.raises(MalformedResponse, match="not a whole number"):
        Usage(bad, 3)
    with pytest.raises(MalformedResponse):
        Usage(3, bad)
    assert Usage(0, MAX_CALL_TOKENS).total_tokens == MAX_CALL_TOKENS


def test_a_negative_price_is_refused_at_declaration() -> None:
    with pytest.raises(DefinitionError, match="pricing"):
        Pricing.per_million(input=-1.0, output=0.5)
    with pytest.raises(DefinitionError, match="pricing"):
        Pricing(float("nan"), 0.0)


def test_negative_usage_never_raises_the_remaining_budget(tmp_path: Path) -> None:
    """The reproduction: one answer with negative tokens, then honest ones, a 2,000-token budget."""
    liar = {"text": "free", "usage": {"input_tokens": -10_000, "output_tokens": 0}}
    honest = {"text": "billed", "usage": {"output_tokens": 100}}
    mock = MockModel(turns=[liar] + [honest] * 11)

    @task
    def spender() -> dict[str, int]:
        seen = {"ok": 0, "malformed": 0, "refused": 0}
        for _ in range(12):
            try:
                context().model(PROMPT, model=mock, max_output_tokens=100,
                                budget=Budget(tokens=2000), retries=0)
                seen["ok"] += 1
            except MalformedResponse:
                seen["malformed"] += 1
            except BudgetExceeded:
                seen["refused"] += 1
                break
        return seen

    @pipeline
    def flow():
        return spender()

    run = flow.run(store=str(tmp_path / "ledger.duckdb"))
    assert run.result() == {"ok": 1, "malformed": 1, "refused": 1}
    calls = run.model_calls()
    assert [c["finish_reason"] for c in calls] == ["malformed", "stop"]
    # the malformed answer is billed at its reservation (the worst case), not at -10,000
    assert calls[0]["input_tokens"] + calls[0]["output_tokens"] == calls[0]["reserved_tokens"]
    spent = sum(c["input_tokens"] + c["output_tokens"] for c in calls)
    assert 0 < spent <= 2000
