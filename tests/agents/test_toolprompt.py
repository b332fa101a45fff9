"""The prompt, the output grammar and the parser of tool calls for local models."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ledgerflow_agents import ModelRequest
from ledgerflow_agents.toolprompt import build_messages, output_schema, parse_output

from .conftest import TOOLS, user


def accepts(schema: dict[str, Any], text: str) -> bool:
    """Whether lm-format-enforcer's parser for ``schema`` lets ``text`` through whole."""
    lmfe = pytest.importorskip("lmformatenforcer", reason="needs the local-model extra")
    parser = lmfe.JsonSchemaParser(schema)
    parser.config = lmfe.CharacterLevelParserConfig(force_json_field_order=True)
    for ch in text:
        if ch not in parser.get_allowed_characters():
            return False
        parser = parser.add_character(ch)
    return bool(parser.can_end())


def test_the_grammar_admits_allowed_calls_and_answers_only() -> None:
    schema = output_schema(ModelRequest([user("x")], tools=TOOLS))
    assert schema is not None
    assert accepts(schema, '{"tool": "search_index", "arguments": {"query": "patents"}}')
    assert accepts(schema, '{"tool": "save_answer", "arguments": {"path": "a", "text": "b"}}')
    assert accepts(schema, '{"answer": "It is [LICENSE#2]."}')
    assert not accepts(schema, '{"tool": "delete_files", "arguments": {}}')
    assert not accepts(schema, '{"tool": "search_index", "arguments": {"path": "x"}}')
    assert not accepts(schema, '{"tool": "save_answer", "arguments": {"path": "a"}}')
    assert not accepts(schema, '{"tool": "search_index", "arguments": {"query": 3}}')
    assert not accepts(schema, "Sure! I will search.")


def test_tool_choice_narrows_the_grammar() -> None:
    required = output_schema(ModelRequest([user("x")], tools=TOOLS, tool_choice="required"))
    one = output_schema(ModelRequest([user("x")], tools=TOOLS, tool_choice="read_document"))
    none = output_schema(ModelRequest([user("x")], tools=TOOLS, tool_choice="none"))
    assert required is not None and one is not None and none is not None
    assert not accepts(required, '{"answer": "no"}')
    assert accepts(one, '{"tool": "read_document", "arguments": {"path": "a.md"}}')
    assert not accepts(one, '{"tool": "search_index", "arguments": {"query": "a"}}')
    assert accepts(none, '{"answer": "no"}')
    assert not accepts(none, '{"tool": "search_index", "arguments": {"query": "a"}}')
    assert output_schema(ModelRequest([user("x")])) is None   # no tools: free text


def test_the_prompt_lists_only_the_allowed_tools_and_their_examples() -> None:
    req = ModelRequest([{"role": "system", "content": "Cite sources."}, user("patents?")],
                       tools=TOOLS[:2])
    chat = build_messages(req, examples=[("thanks", {"answer": "You are welcome."})])
    system = chat[0]["content"]
    assert system.startswith("Cite sources.")
    assert "- search_index(query: string)" in system and "read_document" in system
    assert "save_answer" not in json.dumps(chat)
    assert chat[1:3] == [{"role": "user", "content": "thanks"},
                         {"role": "assistant", "content": '{"answer": "You are welcome."}'}]
    # the tools' examples alternate (search, read, search, read) and come last
    calls = [json.loads(m["content"])["tool"] for m in chat[3:-1] if m["role"] == "assistant"]
    assert calls == ["search_index", "read_document", "search_index", "read_document"]
    assert chat[-1] == {"role": "user", "content": "patents?"}


def test_earlier_calls_and_results_are_rendered_as_json_turns() -> None:
    call = {"id": "call_0_0", "name": "search_index", "arguments": {"query": "patents"}}
    episode = [user("backups?"),
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "e", "name": "search_index", "arguments": {"query": "backups"}}]},
               {"role": "tool", "tool_call_id": "e", "name": "search_index",
                "content": "[guide#4] nightly"},
               {"role": "assistant", "content": "Nightly [guide#4]."}]
    req = ModelRequest([user("patents?"), {"role": "assistant", "content": "",
                                           "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_0_0", "name": "search_index",
                         "content": "[LICENSE#2] grants"}], tools=TOOLS[:1])
    chat = build_messages(req, examples=[episode])
    assert chat[-3:] == [
        {"role": "user", "content": "patents?"},
        {"role": "assistant",
         "content": '{"tool": "search_index", "arguments": {"query": "patents"}}'},
        {"role": "user", "content": "Result of search_index: [LICENSE#2] grants"}]
    assert {"role": "assistant", "content": '{"answer": "Nightly [guide#4]."}'} in chat


def test_parse_output_splits_calls_from_answers() -> None:
    req = ModelRequest([user("x")], tools=TOOLS)
    assert parse_output('{"answer": "4"}', req) == ("4", [])
    assert parse_output('{"tool": "read_document", "arguments": {"path": "a"}}', req) == (
        "", [("read_document", {"path": "a"})])
    with pytest.raises(ValueError):
        parse_output('{"answer": "unterminated', req)
    with pytest.raises(ValueError):
        parse_output('{"tool": "read_document"}', req)


def test_cite_from_makes_the_answer_name_one_of_the_given_ids() -> None:
    req = ModelRequest([user("x")], tools=TOOLS, cite_from=["LICENSE.md#2", "guide#4"])
    schema = output_schema(req)
    assert schema is not None
    assert accepts(schema, '{"answer": "It grants one.", "cite": "LICENSE.md#2"}')
    assert not accepts(schema, '{"answer": "It grants one.", "cite": "made-up#9"}')
    assert not accepts(schema, '{"answer": "It grants one."}')
    assert parse_output('{"answer": "It grants one. ", "cite": "guide#4"}', req) == (
        "It grants one. [guide#4]", [])
    assert "cite_from" in req.to_dict() and ModelRequest.from_dict(req.to_dict()) == req
    assert "cite_from" not in ModelRequest([user("x")]).to_dict()    # old digests unchanged
    # an earlier answer is shown to the model in the same two-field form
    chat = build_messages(ModelRequest(
        [user("a?"), {"role": "assistant", "content": "Yes [guide#4]."}, user("b?")],
        tools=TOOLS, cite_from=["guide#4"]))
    assert {"role": "assistant",
            "content": '{"answer": "Yes", "cite": "guide#4"}'} in chat


def test_the_answer_is_bounded_so_its_json_fits_the_output_tokens() -> None:
    """Issue 33 #7: SmolLM2 looped ("a copy of a copy of ...") until its 160 output tokens cut
    the answer's JSON (MalformedResponse); the grammar now makes it close the answer in time."""
    from ledgerflow_agents.toolprompt import answer_limit

    req = ModelRequest([user("x")], tools=TOOLS, max_output_tokens=160,
                       cite_from=["licenses/apache-2.0.txt#7"])
    limit = answer_limit(req)
    assert 200 <= limit <= 3 * (160 - 12 - len("licenses/apache-2.0.txt#7"))
    schema = output_schema(req)
    assert schema is not None
    fits = '{"answer": "' + "a" * limit + '", "cite": "licenses/apache-2.0.txt#7"}'
    assert accepts(schema, fits)
    assert not accepts(schema, fits.replace('"a', '"aa', 1))       # one character more
    # an answer the limit closed says so (…), one the model closed does not
    assert parse_output(fits, req) == ("a" * limit + "… [licenses/apache-2.0.txt#7]", [])
    assert parse_output('{"answer": "Yes.", "cite": "licenses/apache-2.0.txt#7"}', req) == (
        "Yes. [licenses/apache-2.0.txt#7]", [])
    # fewer output tokens, a shorter answer
    assert answer_limit(ModelRequest([user("x")], tools=TOOLS, max_output_tokens=48)) < limit
