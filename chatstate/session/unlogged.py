"""Turns that are sent but not stored (llm's ``--no-log``): ``unlogged(chat)``.

The turn goes through the same turn writer, in the same order (persist the user
message, call, persist the reply), but into a ``MemoryStore`` that holds a copy of
the conversation so far (its blobs included): the model sees the history, and
nothing of the new turn reaches the real store. When the process ends, the turn is
gone; invariant 1 (an acknowledged turn is durable) is about stored turns, and this
one is explicitly not stored, which the front ends say on stderr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatstate.core.transcript import new_id

if TYPE_CHECKING:
    from chatstate.session.chat import Chat

NOTICE = "not stored (--no-log): this turn is sent to the model but kept nowhere"


def unlogged(chat: Chat) -> Chat:
    """A Chat like ``chat`` (same id, adapter, model, params, window) whose turns are kept
    only in this process's memory; ``chat``'s store is read, never written."""
    from chatstate.errors import ConversationNotFound
    from chatstate.ops.migrate import copy_conversation
    from chatstate.session.chat import Chat
    from chatstate.stores.memory.store import MemoryStore

    memory = MemoryStore(f"nolog-{new_id()}", url=f"memory://not-stored ({chat.store.url})")
    try:
        chat.store.load(chat.id)
    except ConversationNotFound:
        pass
    else:
        copy_conversation(chat.store, memory, chat.id)
    copy = Chat(memory, conversation_id=chat.id, adapter=chat.adapter, model=chat.model,
                params=chat.params, system=chat._system, title=chat._title,
                context_window=chat.context_window, max_tool_rounds=chat.max_tool_rounds,
                on_tool=chat.on_tool, flush_interval=0.0)
    copy.unlogged = True
    return copy
