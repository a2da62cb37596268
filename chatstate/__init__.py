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

from chatstate import _moved
from chatstate._version import __version__ as __version__

_moved.install()  # the 0.2 module paths (chatstate.content, ...) still import

_EXPORTS = {
    "AsyncChat": "chatstate.session.asyncchat",
    "Batch": "chatstate.batch",
    "ChatstateError": "chatstate.errors",
    "Chat": "chatstate.session.chat",
    "Completion": "chatstate.adapter",
    "ConfigurationError": "chatstate.errors",
    "ConflictError": "chatstate.errors",
    "Conversation": "chatstate.core.transcript",
    "ConversationInUse": "chatstate.errors",
    "ConversationNotFound": "chatstate.errors",
    "CorruptTranscriptError": "chatstate.errors",
    "EphemeralStoreError": "chatstate.errors",
    "Interrupted": "chatstate.session.chat",
    "InvalidConversationId": "chatstate.errors",
    "LeaseLost": "chatstate.errors",
    "Message": "chatstate.core.transcript",
    "ModelAdapter": "chatstate.adapter",
    "ModelError": "chatstate.errors",
    "SchemaVersionError": "chatstate.errors",
    "Store": "chatstate.stores",
    "StoreUnavailable": "chatstate.errors",
    "Tool": "chatstate.core.tools",
    "ToolLoopError": "chatstate.errors",
    "make_adapter": "chatstate.adapter",
    "mcp_tools": "chatstate.tools_mcp",
    "open_store": "chatstate.stores",
    "tool": "chatstate.core.tools",
}

__all__ = [
    "AsyncChat",
    "Batch",
    "Chat",
    "ChatstateError",
    "Completion",
    "ConfigurationError",
    "ConflictError",
    "Conversation",
    "ConversationInUse",
    "ConversationNotFound",
    "CorruptTranscriptError",
    "EphemeralStoreError",
    "Interrupted",
    "InvalidConversationId",
    "LeaseLost",
    "Message",
    "ModelAdapter",
    "ModelError",
    "SchemaVersionError",
    "Store",
    "StoreUnavailable",
    "Tool",
    "ToolLoopError",
    "make_adapter",
    "mcp_tools",
    "open_store",
    "tool",
]

if TYPE_CHECKING:
    from chatstate.adapter import Completion, ModelAdapter, make_adapter
    from chatstate.batch import Batch
    from chatstate.core.tools import Tool, tool
    from chatstate.core.transcript import Conversation, Message
    from chatstate.errors import (
        ChatstateError,
        ConfigurationError,
        ConflictError,
        ConversationInUse,
        ConversationNotFound,
        CorruptTranscriptError,
        EphemeralStoreError,
        InvalidConversationId,
        LeaseLost,
        ModelError,
        SchemaVersionError,
        StoreUnavailable,
        ToolLoopError,
    )
    from chatstate.session.asyncchat import AsyncChat
    from chatstate.session.chat import Chat, Interrupted
    from chatstate.stores import Store, open_store
    from chatstate.tools_mcp import mcp_tools


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatstate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
