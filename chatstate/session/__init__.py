"""The session layer: the one turn writer and what drives it.

``Chat`` and ``AsyncChat`` (the library), the model round and the tool loop, context
fitting and compaction, the writer lease. Front ends (the CLI, ``serve``, the
framework integrations, batch) go through it; it sits on the stores and the adapter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["AsyncChat", "Chat", "Interrupted"]

if TYPE_CHECKING:
    from chatstate.session.asyncchat import AsyncChat
    from chatstate.session.chat import Chat, Interrupted

_EXPORTS = {"Chat": "chatstate.session.chat", "Interrupted": "chatstate.session.chat",
            "AsyncChat": "chatstate.session.asyncchat"}


def __getattr__(name: str) -> Any:  # lazy: importing the layer's leaves stays cheap
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chatstate.session' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
