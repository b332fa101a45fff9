"""The real local model (SmolLM2-135M-Instruct on the CPU): tool choice, grammar, determinism.

Marked ``local_model``; skipped with the reason when the weights or the
runtime are missing (``./dev setup`` installs them). The model is loaded once
for the module; the converted copy in the model cache makes later processes
fast.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerflow_agents import MalformedResponse, ModelRequest, ModelTimeout, get_model
from ledgerflow_agents.local import LocalModel, available, missing_packages

from .conftest import READ, TOOLS, user

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(not available(),
                       reason=f"local model not installed (missing: {', '.join(missing_packages())});"
                              " run ./dev setup"),
]

#: Answers first (the tools' own examples come after them in the prompt).
EXAMPLES: list[Any] = [("how much is 2 plus 2?", {"answer": "4"}),
                       ("thanks!", {"answer": "You are welcome."})]


@pytest.fixture(scope="module")
def local() -> Iterator[LocalModel]:
    model = get_model("local", {"examples": EXAMPLES})
    assert isinstance(model, LocalModel)
    model.backend()          # load once, here, not inside the first test
    yield model


def ask(text: str, **kwargs: Any) -> ModelRequest:
    kwargs.setdefault("tools", TOOLS)
    kwargs.setdefault("max_output_tokens", 48)
    return ModelRequest([user(text)], **kwargs)


@pytest.mark.parametrize("prompt, tool", [
    ("search the index for patents", "search_index"),
    ("read the document notes/readme.txt", "read_document"),
    ("save the answer 'yes' to the file result.txt", "save_answer"),
    ("what does the license say about patents?", "search_index"),
])
def test_it_picks_the_right_tool(local: LocalModel, prompt: str, tool: str) -> None:
    resp = local.complete(ask(prompt))
    assert [c["name"] for c in resp.tool_calls] == [tool], resp.raw
    assert resp.finish_reason == "tool_calls"
    schema = next(t for t in TOOLS if t["name"] == tool)["parameters"]
    assert set(resp.tool_calls[0]["arguments"]) == set(schema["required"])
    assert all(isinstance(v, str) and v for v in resp.tool_calls[0]["arguments"].values())


def test_the_grammar_keeps_it_to_the_allowed_tool(local: LocalModel) -> None:
    # asked to search but only allowed to read: it cannot name search_index
    resp = local.complete(ask("search the index for patents", tools=[READ],
                              tool_choice="required"))
    assert [c["name"] for c in resp.tool_calls] == ["read_document"]
    assert list(resp.tool_calls[0]["arguments"]) == ["path"]


def test_greedy_decoding_repeats_exactly_even_in_another_process(local: LocalModel) -> None:
    req = ask("which documents mention caching?")
    first, second = local.complete(req), local.complete(req)
    assert first.raw == second.raw and first.tool_calls == second.tool_calls
    assert first.request_digest == second.request_digest
    code = ("import json, sys; from ledgerflow_agents import ModelRequest, get_model; "
            "req = ModelRequest.from_dict(json.loads(sys.stdin.read())); "
            f"m = get_model('local', {{'examples': {EXAMPLES!r}}}); "
            "r = m.complete(req); print(json.dumps([r.raw.decode(), r.request_digest]))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(req.to_dict()),
                         capture_output=True, text=True, timeout=600, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [first.raw.decode(),
                                                               first.request_digest]


def test_the_estimate_is_the_billed_input(local: LocalModel) -> None:
    req = ask("look up warranty in the docs")
    assert local.estimate_input_tokens(req) == local.complete(req).usage.input_tokens
    assert local.exact_input_tokens


def test_it_answers_in_plain_text_without_tools(local: LocalModel) -> None:
    resp = local.complete(ModelRequest([user("What is the capital of France?")],
                                       max_output_tokens=24))
    assert "Paris" in resp.text and resp.tool_calls == ()
    assert resp.finish_reason == "stop" and 0 < resp.usage.output_tokens <= 24


def test_it_answers_after_a_tool_result(local: LocalModel) -> None:
    call = {"id": "call_0_0", "name": "search_index", "arguments": {"query": "patents"}}
    req = ModelRequest([user("what does the license say about patents?"),
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_0_0", "name": "search_index",
                         "content": "[LICENSE.md#2] Each contributor grants you a patent "
                                    "license to make, use and sell the work."}],
                       tools=TOOLS, tool_choice="none", max_output_tokens=64)
    resp = local.complete(req)
    assert resp.tool_calls == () and resp.text.strip()
    assert resp.finish_reason == "stop"


def test_too_few_output_tokens_is_a_malformed_answer_that_was_billed(local: LocalModel) -> None:
    with pytest.raises(MalformedResponse) as info:
        local.complete(ask("save the answer 'yes' to the file result.txt", max_output_tokens=4))
    assert info.value.usage is not None and info.value.usage.output_tokens == 4


def test_a_long_answer_is_closed_in_time_and_marked_cut(local: LocalModel) -> None:
    """Issue 33 #7: the model rambled until max_output_tokens cut its JSON (MalformedResponse,
    doc_qa failed); the grammar now closes the answer at its limit and says it was cut."""
    from ledgerflow_agents.toolprompt import answer_limit

    req = ask("Tell me the whole history of the Roman Empire, emperor by emperor, in detail.",
              tool_choice="none", max_output_tokens=40)
    resp = local.complete(req)
    assert resp.tool_calls == () and resp.finish_reason == "length", resp.raw
    assert resp.text.endswith("…") and len(resp.text) <= answer_limit(req) + 1
    assert resp.usage.output_tokens <= 40


def test_a_deadline_stops_generation(local: LocalModel) -> None:
    with pytest.raises(ModelTimeout) as info:
        local.complete(ask("search the index for patents"), timeout=0.001)
    assert info.value.usage is not None and info.value.usage.input_tokens > 0


def test_a_pickled_model_carries_no_weights(local: LocalModel) -> None:
    blob = pickle.dumps(local)
    assert len(blob) < 10_000
    again = pickle.loads(blob)
    assert again.complete(ask("search the index for patents")).tool_calls[0]["name"] == \
        "search_index"


@pytest.mark.slow
def test_the_cached_model_is_the_gguf_model(local: LocalModel) -> None:
    direct = LocalModel(cache_dir=False, examples=EXAMPLES)   # converts the GGUF in memory
    req = ask("show me the contents of docs/faq.md")
    assert direct.complete(req).raw == local.complete(req).raw
    import torch

    ids = torch.tensor([local.backend().prompt_ids(local.prompt(req))])
    with torch.no_grad():
        a = direct.backend().model(ids).logits
        b = local.backend().model(ids).logits
    assert torch.equal(a, b)
