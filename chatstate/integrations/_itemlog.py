"""ItemLog: a conversation of a store used as a framework's item list (sync, thread-safe).

The one place the integrations write: load, build the messages from what is stored,
compare-and-append them in one append (through the session's turn writer), and on a
ConflictError (another writer got there first) load again and rebuild. A batch lands
whole or not at all. No writer lease is held: each write is one compare-and-append,
fenced by the seq it read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from chatstate.core.events import event_message
from chatstate.core.transcript import Conversation, Message, new_turn_id, validate_id
from chatstate.errors import ConflictError, ConversationNotFound
from chatstate.integrations import _items
from chatstate.session.turn_writer import TurnWriter
from chatstate.stores.base import Store

T = TypeVar("T")
ATTEMPTS = 200  # compare-and-append retries under contention before giving up


class ItemLog:
    """The items of conversation ``conversation_id`` in ``store`` (a Store or a URL)."""

    def __init__(self, conversation_id: str, store: Store | str | None, *, framework: str,
                 allow_ephemeral: bool = False) -> None:
        self.id = validate_id(conversation_id)
        self._owns_store = store is None or isinstance(store, str)
        if store is None or isinstance(store, str):
            from chatstate.stores import open_store

            self.store: Store = open_store(store, allow_ephemeral=allow_ephemeral)
        else:
            self.store = store
        self.framework = framework
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def load(self) -> Conversation:
        """The stored conversation (an empty one if it does not exist yet)."""
        try:
            conv: Conversation = self.store.load(self.id)
        except ConversationNotFound:
            return Conversation(id=self.id, title=f"{self.framework} session {self.id}",
                                metadata={"framework": self.framework})
        return conv

    def items(self) -> list[dict[str, Any]]:
        """Every item shown now, oldest first, as stored (not paired)."""
        return [m.extra[_items.KEY] for m in _items.view(self.load().messages)
                if m.extra is not None]

    def write(self, build: Callable[[Conversation], tuple[list[Message], T]]) -> T:
        """Append what ``build(conversation)`` returns, rebuilt after each conflict."""
        with self._lock:
            for attempt in range(ATTEMPTS):
                conv = self.load()
                messages, result = build(conv)
                if not messages:
                    return result
                # created only when it has no messages: if it exists, the append decides
                writer = TurnWriter(self.store, conv, created=bool(conv.messages))
                try:
                    writer.create()
                    writer.append(messages)
                    return result
                except ConflictError:
                    time.sleep(min(0.05, 0.001 * (attempt + 1)))
            raise ConflictError(f"conversation {self.id!r}: {ATTEMPTS} writers in a row got "
                                "there first; nothing of this batch was written")

    # -- the operations ------------------------------------------------------------
    def add(self, items: Sequence[dict[str, Any]],
            derive: _items.Derive = _items.fields_of) -> None:
        """Append every item in one compare-and-append (nothing if ``items`` is empty)."""
        plain = [_items.plain(item, f"{self.framework} session {self.id!r}") for item in items]
        if not plain:
            return
        turn_id = new_turn_id()
        self.write(lambda conv: (_items.seal_items(conv.last, plain, turn_id, derive), None))

    def pop(self) -> dict[str, Any] | None:
        def build(conv: Conversation) -> tuple[list[Message], dict[str, Any] | None]:
            shown = _items.view(conv.messages)
            if not shown or shown[-1].extra is None:
                return [], None
            event = event_message(conv.last, "pop", new_turn_id(), shown[-1].seq)
            return [event], shown[-1].extra[_items.KEY]
        return self.write(build)

    def clear(self) -> None:
        def build(conv: Conversation) -> tuple[list[Message], None]:
            if not _items.view(conv.messages):
                return [], None
            return [event_message(conv.last, "clear", new_turn_id())], None
        self.write(build)

    def open_calls(self) -> list[dict[str, Any]]:
        """Calls shown with no output after them: an interrupted turn."""
        items = self.items()
        answered = {i.get("call_id") for i in items if i.get("type") in _items._OUTPUTS}
        return [i for i in items if i.get("type") in _items.PAIRED_CALLS
                and i.get("call_id") not in answered]
