"""LangChain's chat message history over a chatstate store.

    from chatstate.integrations.langchain import ChatstateChatMessageHistory
    history = ChatstateChatMessageHistory("user-42", store="sqlite:///var/lib/app/chat.db")

Each message is kept as LangChain's own dict form (``message_to_dict``) inside one
hash-chained chatstate message, so tool calls, ``ToolMessage``s, content blocks and
additional kwargs come back as they went in. ``add_messages`` is one durable
compare-and-append for the batch; ``clear`` appends an event (nothing is deleted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from chatstate.errors import MissingExtra
from chatstate.integrations import _items
from chatstate.integrations._itemlog import ItemLog
from chatstate.stores.base import Store

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("chatstate.integrations.langchain needs langchain-core: "
                       "pip install 'chatstate[langchain]'", extra="langchain") from exc

__all__ = ["ChatstateChatMessageHistory"]

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
          "AIMessageChunk": "assistant", "HumanMessageChunk": "user"}


def _fields(item: dict[str, Any]) -> dict[str, Any]:
    """Role, text and tool calls of a ``message_to_dict`` form, for replay and search."""
    data = item.get("data") if isinstance(item.get("data"), dict) else {}
    assert isinstance(data, dict)
    fields: dict[str, Any] = {"role": _ROLES.get(str(item.get("type")), "assistant"),
                              "content": _items._text(data.get("content"))}
    calls = [{"id": c["id"], "type": "function",
              "function": {"name": c["name"], "arguments": json.dumps(c.get("args", {}))}}
             for c in data.get("tool_calls") or ()
             if isinstance(c, dict) and isinstance(c.get("id"), str)
             and isinstance(c.get("name"), str)]
    if calls:
        fields["tool_calls"] = calls
    if fields["role"] == "tool" and isinstance(data.get("tool_call_id"), str):
        fields["tool_call_id"] = data["tool_call_id"]
    return fields


class ChatstateChatMessageHistory(BaseChatMessageHistory):
    """A ``BaseChatMessageHistory`` whose messages live in a chatstate store.

    ``session_id`` is the conversation id; ``store`` a Store or a store URL (default:
    ``CHATSTATE_STORE`` or the platform default). A store opened from a URL is closed by
    ``close()``.
    """

    def __init__(self, session_id: str, store: Store | str | None = None, *,
                 allow_ephemeral: bool = False) -> None:
        self._log = ItemLog(session_id, store, framework="langchain",
                            allow_ephemeral=allow_ephemeral)
        self.session_id = self._log.id

    @property
    def store(self) -> Store:
        return self._log.store

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every message shown now, oldest first (read from the store each time)."""
        return list(messages_from_dict(self._log.items()))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the batch in one durable compare-and-append: all of it or none."""
        self._log.add([message_to_dict(m) for m in messages], _fields)

    def clear(self) -> None:
        """Hide every message (an event in the chain; nothing is deleted)."""
        self._log.clear()

    async def aget_messages(self) -> list[BaseMessage]:
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await asyncio.to_thread(self.add_messages, list(messages))

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    def close(self) -> None:
        self._log.close()
