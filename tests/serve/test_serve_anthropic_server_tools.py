"""A server tool's blocks (web search, code execution) in an Anthropic reply are kept.

They were dropped from the stored reply (only its text, tool calls and thinking were
kept), while a client sending its history back sent them as content: the histories
never matched, and every later turn started a new conversation. They ride on the
reply in ``extra["server_blocks"]`` now, as thinking blocks do, the request side
reads them the same way, and chatstate's own client sends them back.
"""

from __future__ import annotations

from typing import Any

from chatstate.adapter.dialects.anthropic_messages import ANTHROPIC_MESSAGES, MessagesStream
from chatstate.core.transcript import Message
from chatstate.serve._history import message_fields, stored_form, wire_form
from chatstate.serve._messages import _fields, request_messages

SEARCH: list[dict[str, Any]] = [
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
     "input": {"query": "weather in Paris"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
        {"type": "web_search_result", "url": "https://example.com/paris", "title": "Paris",
         "encrypted_content": "EqgfCioIARgB", "page_age": None}]},
    {"type": "text", "text": "It is sunny."}]
REPLY = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
         "content": SEARCH, "stop_reason": "end_turn", "stop_sequence": None,
         "usage": {"input_tokens": 5, "output_tokens": 7}}


def stored(fields: dict[str, Any]) -> Message:
    user = Message.seal(None, role="user", content="weather?", turn_id="t1")
    return Message.seal(user, role="assistant", turn_id="t1", **fields)


def test_the_reply_keeps_them_and_the_history_sent_back_matches_it() -> None:
    reply = stored(_fields(REPLY))
    assert reply.text == "It is sunny."
    assert reply.extra == {"server_blocks": SEARCH[:2]}
    [_, back] = request_messages({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": SEARCH}]})
    assert wire_form(back) == stored_form(reply)  # the same history: no new conversation
    assert message_fields(back)["extra"] == reply.extra


def test_a_streamed_reply_keeps_them_too() -> None:
    stream = MessagesStream()
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**REPLY, "content": []}},
        {"type": "content_block_start", "index": 0,
         "content_block": {**SEARCH[0], "input": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": '{"query": "weather in Paris"}'}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": SEARCH[1]},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2,
         "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "text_delta", "text": "It is sunny."}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": 7}},
        {"type": "message_stop"}]
    for event in events:
        stream.feed(event)
    reply = stream.reply()
    assert reply.text == "It is sunny."
    assert reply.extra == {"server_blocks": SEARCH[:2]}


def test_chatstates_own_client_sends_them_back_before_the_text() -> None:
    reply = stored(_fields(REPLY))
    history = [{"role": "user", "content": "weather?"}, reply.to_openai(provider=True),
               {"role": "user", "content": "and tomorrow?"}]
    body = ANTHROPIC_MESSAGES.encode(history, model="claude-x", params=None, stream=False)
    assert body["messages"][1] == {"role": "assistant", "content": SEARCH}
