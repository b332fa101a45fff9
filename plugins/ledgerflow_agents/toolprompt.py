"""Tool calling for models without a tool API: the prompt, the output grammar, the parser.

A small local model sees the allowed tools in its system prompt and answers
with one JSON object, either a tool call or a final answer::

    {"tool": "search_index", "arguments": {"query": "patents"}}
    {"answer": "The licence grants a patent license [LICENSE.md#2]."}
    {"answer": "The licence grants a patent license.", "cite": "LICENSE.md#2"}

(the last when the request asks to cite one of given ids, ``cite_from``: the
text becomes ``... [LICENSE.md#2]``).

An answer's text is at most :func:`answer_limit` characters (about three a
token of the request's ``max_output_tokens``, less room for the JSON and the
id to cite): a small model that rambles or repeats itself is made to close
its answer in time instead of being cut mid-JSON. An answer that reached the
limit is marked cut (it ends with ``…``; :func:`answer_was_cut`).

:func:`output_schema` is the JSON Schema of exactly those objects for the
allowed tools (``tool_choice`` can drop the answer or keep one tool), which
the decoder enforces token by token, so the model cannot name another tool
or leave out a required argument. Few-shot examples come from each tool's
``examples`` (``[{"user": ..., "arguments": {...}}]``) and from the
provider's ``examples`` option (shown first); earlier tool calls and results in the
conversation are rendered in the same JSON form. Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .provider import ModelRequest, ToolSpec

__all__ = ["DEFAULT_EXAMPLES", "answer_limit", "answer_was_cut", "build_messages",
           "output_schema", "parse_output", "render_call"]

#: Characters of answer text allowed per output token (English runs about four).
CHARS_PER_TOKEN = 3
#: Output tokens kept for the JSON around an answer (``{"answer": "", "cite": ""}``).
_JSON_TOKENS = 12

#: Answer examples used when the request's tools and the provider bring none.
DEFAULT_EXAMPLES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("how much is 2 plus 2?", {"answer": "4"}),
)

_PROTOCOL = ("You can call tools. Reply with exactly one JSON object and nothing else.\n"
             'To call a tool write {"tool": NAME, "arguments": {...}}.\n'
             'To reply to the user write {"answer": TEXT}.\n'
             "Tools:\n")


def _signature(tool: ToolSpec) -> str:
    props = tool["parameters"].get("properties") or {}
    args = ", ".join(f"{k}: {v.get('type', 'any')}" if isinstance(v, Mapping) else k
                     for k, v in props.items())
    line = f"- {tool['name']}({args})"
    return f"{line}: {tool['description']}" if tool.get("description") else line


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The JSON text of one tool call as the model writes it."""
    return json.dumps({"tool": name, "arguments": dict(arguments)}, ensure_ascii=False)


def _allowed(request: ModelRequest) -> tuple[list[ToolSpec], bool]:
    """The tools the model may call now, and whether it may answer instead."""
    choice = request.tool_choice
    tools = list(request.tools)
    if choice == "none":
        return [], True
    if choice == "required":
        return tools, False
    if choice != "auto":
        return [t for t in tools if t["name"] == choice], False
    return tools, True


def answer_limit(request: ModelRequest) -> int:
    """The most characters an answer's text may have so that its JSON fits the request.

    ``CHARS_PER_TOKEN`` characters per output token left after the JSON
    around it and the longest id it may cite (counted a token a character).
    """
    reserve = _JSON_TOKENS + max((len(c) for c in request.cite_from), default=0)
    return max(8, CHARS_PER_TOKEN * (request.max_output_tokens - reserve))


_ANSWER_TEXT = re.compile(r'\s*\{\s*"answer"\s*:\s*"((?:[^"\\]|\\.)*)"')


def answer_was_cut(text: str, request: ModelRequest) -> bool:
    """Whether the answer in ``text`` (the model's JSON) reached :func:`answer_limit`."""
    m = _ANSWER_TEXT.match(text)
    return m is not None and len(m.group(1)) >= answer_limit(request)


def may_answer(request: ModelRequest) -> bool:
    """True if the model may answer in text now (not only call a tool)."""
    return _allowed(request)[1]


def output_schema(request: ModelRequest) -> dict[str, Any] | None:
    """The JSON Schema the answer must match, or ``None`` for free text (no tools)."""
    if not request.tools:
        return None
    tools, may_answer = _allowed(request)
    branches: list[dict[str, Any]] = []
    for tool in tools:
        params = dict(tool["parameters"])
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        branches.append({"type": "object",
                         "properties": {"tool": {"type": "string", "enum": [tool["name"]]},
                                        "arguments": params},
                         "required": ["tool", "arguments"]})
    if may_answer:
        props: dict[str, Any] = {"answer": {"type": "string",
                                            "maxLength": answer_limit(request)}}
        if request.cite_from:       # the answer names one of these: exactly, by the grammar
            props["cite"] = {"type": "string", "enum": list(request.cite_from)}
        branches.append({"type": "object", "properties": props, "required": list(props)})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _content_of(message: Mapping[str, Any]) -> str:
    if message["role"] == "assistant" and message.get("tool_calls"):
        return "\n".join(render_call(c["name"], c["arguments"]) for c in message["tool_calls"])
    if message["role"] == "tool":
        return f"Result of {message.get('name') or 'the tool'}: {message['content']}"
    return str(message["content"])


Example = tuple[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]]


def _is_pair(example: Example) -> bool:
    return (isinstance(example, tuple) and len(example) == 2 and isinstance(example[0], str)
            and isinstance(example[1], Mapping))


def _answer(text: str, cite: bool) -> dict[str, str]:
    """An answer as the model writes it: with ``cite``, ``[ID]`` at its end apart."""
    m = re.match(r"^(.*?)\s*\[([^\]\s]+)\]\.?$", text, re.S) if cite else None
    return {"answer": m.group(1), "cite": m.group(2)} if m else {"answer": text}


def _render_json_turns(messages: Sequence[Mapping[str, Any]],
                       cite: bool = False) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for m in messages:
        if m["role"] == "assistant" and not m.get("tool_calls"):
            out.append({"role": "assistant",
                        "content": json.dumps(_answer(str(m.get("content") or ""), cite),
                                              ensure_ascii=False)})
        else:
            out.append({"role": "user" if m["role"] == "tool" else str(m["role"]),
                        "content": _content_of(m)})
    return out


def build_messages(request: ModelRequest,
                   examples: Sequence[Example] = ()) -> list[dict[str, str]]:
    """The chat (system, few-shot turns, conversation) a template-only model sees.

    ``examples`` are ``(user text, reply)`` pairs (a reply is ``{"tool":
    name, "arguments": {...}}`` or ``{"answer": text}``) or whole example
    conversations (message lists, e.g. a question, a tool call, its result
    and the answer citing it). With tools, every earlier assistant turn is
    JSON, so the examples and the conversation agree on one format. Without tools the conversation passes
    through unchanged (tool results become user turns).
    """
    systems = [m["content"] for m in request.messages if m["role"] == "system" and m["content"]]
    rest = [m for m in request.messages if m["role"] != "system"]
    out: list[dict[str, str]] = []
    if request.tools:
        tools, _ = _allowed(request)
        shown = tools or list(request.tools)
        system = "\n\n".join([*systems, _PROTOCOL + "\n".join(_signature(t) for t in shown)])
        out.append({"role": "system", "content": system})
        per_tool = [[(str(ex["user"]), {"tool": tool["name"],
                                        "arguments": dict(ex.get("arguments") or {})})
                     for ex in tool.get("examples") or ()] for tool in shown]
        # round robin (search, read, save, search, ...): a small model copies the
        # most recent examples, so no tool's examples may all come last
        shots: list[tuple[str, Mapping[str, Any]]] = [
            group[i] for i in range(max(map(len, per_tool), default=0))
            for group in per_tool if i < len(group)]
        conversations: list[Sequence[Mapping[str, Any]]] = []
        pairs: list[tuple[str, Mapping[str, Any]]] = []
        for example in examples:
            if isinstance(example, tuple) and _is_pair(example):
                pairs.append((str(example[0]), example[1]))
            else:
                conversations.append(example)  # type: ignore[arg-type]
        # answers and whole conversations first, then the tools' examples: the
        # examples nearest the question weigh most
        if not pairs and not conversations:
            pairs = list(DEFAULT_EXAMPLES)
        for user, reply in [*pairs, *shots]:
            out.append({"role": "user", "content": str(user)})
            text = (render_call(str(reply["tool"]), reply.get("arguments") or {})
                    if "tool" in reply else json.dumps({"answer": str(reply.get("answer", ""))},
                                                       ensure_ascii=False))
            out.append({"role": "assistant", "content": text})
        for conversation in conversations:
            out += _render_json_turns(conversation, bool(request.cite_from))
        out += _render_json_turns(rest, bool(request.cite_from))
    else:
        if systems:
            out.append({"role": "system", "content": "\n\n".join(systems)})
        for m in rest:
            out.append({"role": "user" if m["role"] == "tool" else m["role"],
                        "content": _content_of(m)})
    return out


def parse_output(text: str, request: ModelRequest) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Split the model's JSON into (answer text, [(tool, arguments)]).

    An answer that reached :func:`answer_limit` ends with ``…`` (before its
    citation).

    Raises:
        ValueError: the text is not one of the objects :func:`output_schema`
            allows (only possible when decoding was cut short).
    """
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {text[:80]!r}")
    if "answer" in doc:
        answer = str(doc["answer"])
        if answer_was_cut(text, request):
            answer = answer.rstrip() + "…"      # stopped by the limit, not by the model
        if doc.get("cite"):
            return f"{answer.rstrip()} [{doc['cite']}]", []
        return answer, []
    name, args = doc.get("tool"), doc.get("arguments")
    if not isinstance(name, str) or not isinstance(args, dict):
        raise ValueError(f"expected a tool call or an answer, got {text[:80]!r}")
    return "", [(name, args)]
