"""The wire APIs ``chatstate drill --serve --api`` streams through the proxy.

Each is what a streaming client of that API sends (the path, the body from the
turns it already has and the new user text) and how it reads the stream (the
reply text a data line carries, and whether the line says the reply is whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["API_NAMES", "WireApi", "wire_api"]


@dataclass(frozen=True)
class WireApi:
    name: str
    path: str

    def body(self, history: list[dict[str, str]], text: str) -> dict[str, Any]:
        turns = [*history, {"role": "user", "content": text}]
        if self.name == "responses":
            return {"model": "m", "stream": True, "input": turns}
        if self.name == "anthropic":
            return {"model": "m", "stream": True, "max_tokens": 1024, "messages": turns}
        return {"model": "m", "stream": True, "messages": turns}

    def read(self, line: str) -> tuple[str, bool]:
        """(the reply text ``line`` carries, whether it ends a whole reply)."""
        if self.name == "chat":
            if line == "data: [DONE]":
                return "", True
            if not line.startswith("data: {"):
                return "", False
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or [{}]
            return str((choices[0].get("delta") or {}).get("content") or ""), False
        if not line.startswith("data: {"):
            return "", False
        event = json.loads(line[6:])
        kind = event.get("type")
        if self.name == "responses":
            if kind == "response.output_text.delta":
                return str(event.get("delta") or ""), False
            return "", kind == "response.completed"
        delta = event.get("delta") or {}
        if kind == "content_block_delta" and delta.get("type") == "text_delta":
            return str(delta.get("text") or ""), False
        return "", kind == "message_stop"


_APIS = {"chat": WireApi("chat", "/chat/completions"),
         "responses": WireApi("responses", "/responses"),
         "anthropic": WireApi("anthropic", "/messages")}
API_NAMES = tuple(_APIS)


def wire_api(name: str) -> WireApi:
    try:
        return _APIS[name]
    except KeyError:
        raise ValueError(f"unknown wire API {name!r}: use one of {', '.join(API_NAMES)}"
                         ) from None
