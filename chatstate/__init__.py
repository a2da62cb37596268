"""chatstate: a resilient LLM conversation client with persisted transcripts.

The public API is re-exported here and loaded lazily, so ``import chatstate``
(and the CLI) start fast::

    store = chatstate.open_store("sqlite:///home/me/chat.db")
    chat = chatstate.Chat(store, model="gpt-4o-mini")
    reply = chat.send("hello")              # a Message, already durable
    for delta in chat.stream("and then?"):  # each delta durable before it is yielded
        print(delta, end="")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AsyncChat": "chatstate.asyncchat",
    "Batch": "chatstate.batch",
    "ChatstateError": "chatstate.errors",
    "Chat": "chatstate.session",
    "Completion": "chatstate.adapter",
    "ConflictError": "chatstate.errors",
    "Conversation": "chatstate.transcript",
    "ConversationInUse": "chatstate.errors",
    "ConversationNotFound": "chatstate.errors",
    "CorruptTranscriptError": "chatstate.errors",
    "EphemeralStoreError": "chatstate.errors",
    "Interrupted": "chatstate.session",
    "InvalidConversationId": "chatstate.errors",
    "Message": "chatstate.transcript",
    "ModelAdapter": "chatstate.adapter",
    "ModelError": "chatstate.errors",
    "SchemaVersionError": "chatstate.errors",
    "Store": "chatstate.stores",
    "StoreUnavailable": "chatstate.errors",
    "Tool": "chatstate.tools",
    "ToolLoopError": "chatstate.errors",
    "make_adapter": "chatstate.adapter",
    "open_store": "chatstate.stores",
    "tool": "chatstate.tools",
}

__all__ = [
    "AsyncChat",
    "Batch",
    "Chat",
    "ChatstateError",
    "Completion",
    "ConflictError",
    "Conversation",
    "ConversationInUse",
    "ConversationNotFound",
    "CorruptTranscriptError",
    "EphemeralStoreError",
    "Interrupted",
    "InvalidConversationId",
    "Message",
    "ModelAdapter",
    "ModelError",
    "SchemaVersionError",
    "Store",
    "StoreUnavailable",
    "Tool",
    "ToolLoopError",
    "make_adapter",
    "open_store",
    "tool",
]

if TYPE_CHECKING:
    from .adapter import Completion, ModelAdapter, make_adapter
    from .asyncchat import AsyncChat
    from .batch import Batch
    from .errors import (
        ChatstateError,
        ConflictError,
        ConversationInUse,
        ConversationNotFound,
        CorruptTranscriptError,
        EphemeralStoreError,
        InvalidConversationId,
        ModelError,
        SchemaVersionError,
        StoreUnavailable,
        ToolLoopError,
    )
    from .session import Chat, Interrupted
    from .stores import Store, open_store
    from .tools import Tool, tool
    from .transcript import Conversation, Message


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatstate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
