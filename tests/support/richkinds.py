"""Messages of every content kind a 0.2 transcript holds, for the store and transfer tests."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from chatstate.core.content import file, image, store_parts, text
from chatstate.core.transcript import Message

PNG_1MIB = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"seed").digest() * (1024 * 1024 // 32)
PNG_SMALL = b"\x89PNG\r\n\x1a\n" + b"\x00" * 300
PDF = b"%PDF-1.4\n" + b"x" * (100 * 1024)


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


KINDS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "text-parts": lambda: [_user([text("one"), text("two")])],
    "image-url": lambda: [_user([text("look"), image("https://example.invalid/cat.png",
                                                     detail="low")])],
    "image-small": lambda: [_user([image(PNG_SMALL, name="tiny.png")])],
    "image-large": lambda: [_user([text("big"), image(PNG_1MIB, name="big.png")])],
    "file": lambda: [_user([file(PDF, media_type="application/pdf", name="report.pdf")])],
    "tool-calls": lambda: [
        _user("weather?"),
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "content": "rain, 4 C", "tool_call_id": "call_1",
         "name": "get_weather"},
        {"role": "tool", "content": "boom", "tool_call_id": "call_2", "status": "error"},
        {"role": "tool", "content": "interrupted", "tool_call_id": "call_3",
         "status": "unknown"}],
    "unknown-part": lambda: [_user([{"type": "input_audio", "input_audio": {
        "data": "AAAA", "format": "wav"}}, {"type": "x-future", "payload": [1, {"a": None}]}])],
    "extra-fields": lambda: [
        _user("hi"),
        {"role": "assistant", "content": "no", "extra": {"refusal": "I can't",
                                                          "reasoning": {"steps": 3}}}],
}


def seal_kind(store: Any, kind: str, prev: Message | None = None) -> list[Message]:
    """Seal the messages of ``kind`` after ``prev``, large data moved into ``store``'s blobs."""
    out: list[Message] = []
    for item in KINDS[kind]():
        item = dict(item)
        role, content = item.pop("role"), store_parts(store, item.pop("content"))
        prev = Message.seal(prev, role=role, content=content, turn_id="t-rich", **item)
        out.append(prev)
    return out
