"""The fake model's deterministic replies, in the exact OpenAI wire shapes.

A reply is a pure function of the request's messages: ``"Echo: <last user
content>"`` followed by ``reply_words`` filler words picked by a hash of the
whole message list. The same conversation always gets the same reply, in the
same chunks, in every process, so a retried stream can be checked
character by character and a test can compute the reply it expects.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from chatstate.testing._parts import echo_text

FILLER = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "garnet", "harbor",
    "indigo", "juniper", "kestrel", "lantern", "meadow", "nectar", "onyx", "pebble",
    "quartz", "river", "saffron", "timber", "umber", "velvet", "willow", "xenon",
    "yarrow", "zephyr", "basalt", "cobalt", "dune", "ferro", "glacier", "hollow",
)

# Split before every non-space that follows a space: pieces keep their
# trailing whitespace, so "".join(chunks) == text exactly.
CHUNK_BOUNDARY = re.compile(r"(?<=\s)(?=\S)")


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return echo_text(content)
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def reply_chunks(messages: Sequence[Mapping[str, Any]], reply_words: int = 8,
                 max_tokens: int | None = None) -> tuple[list[str], str]:
    """The reply's stream pieces and its finish_reason ("length" when max_tokens cut it)."""
    last_user = next((_content(m) for m in reversed(messages) if m.get("role") == "user"), "")
    canonical = json.dumps([dict(m) for m in messages], sort_keys=True, ensure_ascii=True)
    digest = hashlib.sha256(canonical.encode()).digest()
    filler = [FILLER[digest[i % len(digest)] % len(FILLER)] for i in range(max(reply_words, 0))]
    text = f"Echo: {last_user}" + "".join(f" {word}" for word in filler)
    chunks = [c for c in CHUNK_BOUNDARY.split(text) if c]
    if max_tokens is not None and 0 <= max_tokens < len(chunks):
        return chunks[:max_tokens], "length"
    return chunks, "stop"


def tool_reply(messages: Sequence[Mapping[str, Any]], rules: Sequence[Any],
               offered: Sequence[str] = ()) -> tuple[str, list[dict[str, Any]]] | None:
    """The reply of a turn scripted by tool rules: (text, tool calls), or None for an echo.

    While the turn (the messages after the last user message) has had fewer than
    ``rule.rounds`` replies with tool calls, the reply calls the rule's tools; once a
    round is answered, a request ending in ``tool`` messages is answered by reading
    those results back, so a test can see exactly what the model received.

    Without a rule, a user message that writes ``NAME(JSON)`` for a tool the request
    offers gets that call (once per turn): the offline demo's way to call a tool.
    """
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    last_user = _content(messages[start]) if start >= 0 else ""
    rounds = sum(1 for m in messages[start + 1:]
                 if m.get("role") == "assistant" and m.get("tool_calls"))
    rule = next((r for r in rules if r.contains in last_user), None)
    wanted = rule.calls if rule is not None and rounds < rule.rounds else \
        _written_calls(last_user, offered) if rule is None and rounds == 0 else []
    if wanted:
        seed = hashlib.sha256(json.dumps([dict(m) for m in messages], sort_keys=True,
                                         ensure_ascii=True).encode()).hexdigest()
        calls = [{"id": c.get("id", f"call_{seed[:10]}_{i}"), "type": "function", "function": {
            "name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
            else json.dumps(c["arguments"])}} for i, c in enumerate(wanted)]
        return (rule.text if rule is not None else ""), calls
    if messages and messages[-1].get("role") == "tool":
        results = []
        for m in reversed(messages):
            if m.get("role") != "tool":
                break
            results.append(f"{m.get('tool_call_id')}={_content(m)}")
        return "Tool results: " + "; ".join(reversed(results)), []
    return None


def _written_calls(text: str, offered: Sequence[str]) -> list[dict[str, Any]]:
    if not offered:
        return []
    names = "|".join(re.escape(n) for n in offered)
    return [{"name": m.group(1), "arguments": m.group(2).strip() or "{}"}
            for m in re.finditer(rf"\b({names})\((.*?)\)(?!\S*\))", text)]


def reply_text(messages: Sequence[Mapping[str, Any]], reply_words: int = 8,
               max_tokens: int | None = None) -> str:
    """The whole reply the fake gives to ``messages`` (what the tests expect to see)."""
    return "".join(reply_chunks(messages, reply_words, max_tokens)[0])


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The fake's tokenizer: one token per whitespace-separated word of each content."""
    return sum(len(_content(m).split()) for m in messages)


def usage(messages: Sequence[Mapping[str, Any]], chunks: Sequence[str]) -> dict[str, int]:
    """Token counts: one token per whitespace-separated word in, one per chunk out."""
    prompt = prompt_tokens(messages)
    return {"prompt_tokens": prompt, "completion_tokens": len(chunks),
            "total_tokens": prompt + len(chunks)}


def call_deltas(calls: Sequence[Mapping[str, Any]], arg_chunk: int) -> list[dict[str, Any]]:
    """Stream deltas for tool calls, as chat-completions sends them: per call, one delta
    with index, id, type and name, then the arguments in ``arg_chunk``-sized pieces."""
    deltas: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                       "function": {"name": name, "arguments": ""}}]})
        step = arg_chunk if arg_chunk > 0 else max(len(arguments), 1)
        for at in range(0, len(arguments), step):
            deltas.append({"tool_calls": [{"index": index, "function": {
                "arguments": arguments[at:at + step]}}]})
    return deltas


def completion_body(cid: str, model: str, created: int, text: str, finish_reason: str,
                    token_usage: dict[str, int],
                    tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
        message["content"] = text or None
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{
            "index": 0, "message": message,
            "logprobs": None, "finish_reason": finish_reason,
        }],
        "usage": token_usage, "system_fingerprint": "fp_chatstate_fake",
    }


def chunk_body(cid: str, model: str, created: int, *, delta: dict[str, Any] | None = None,
               finish_reason: str | None = None, include_usage: bool = False,
               token_usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` gives the final usage-only chunk."""
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
        "system_fingerprint": "fp_chatstate_fake",
        "choices": [] if delta is None else [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:  # OpenAI sends "usage": null on every chunk but the last
        body["usage"] = token_usage
    return body


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = {401: "invalid_request_error", 429: "rate_limit_exceeded"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


def default_error_message(status: int) -> str:
    return {
        400: "Bad request (fake).",
        401: "Incorrect API key provided (fake).",
        403: "Permission denied (fake).",
        404: "The model does not exist (fake).",
        429: "Rate limit reached for requests (fake).",
    }.get(status, "The server had an error while processing your request (fake).")
