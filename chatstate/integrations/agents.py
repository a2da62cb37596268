"""The OpenAI Agents SDK's Session protocol over a chatstate store.

    from chatstate.integrations.agents import ChatstateSession
    session = ChatstateSession("user-42", store="sqlite:///var/lib/app/chat.db")
    result = await Runner.run(agent, "hi", session=session)

Each item the SDK adds is one hash-chained message holding the item verbatim, so
it comes back JSON-identical from json, sqlite and s3, kinds chatstate does not
know included. ``add_items`` is one compare-and-append: the batch lands whole or
not at all. ``pop_item`` and ``clear_session`` append events; the items the SDK
sees are computed from the chain, and a call whose output never arrived is handed
back with an "outcome unknown" output, never alone (see ``open_calls``).

Store calls block, so each method runs them in a worker thread; the logic is
written once, synchronously, in ItemLog.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from chatstate.errors import MissingExtra
from chatstate.integrations import _items
from chatstate.integrations._itemlog import ItemLog
from chatstate.stores.base import Store

try:
    from agents.memory import SessionSettings
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("chatstate.integrations.agents needs the OpenAI Agents SDK: "
                       "pip install 'chatstate[agents]'", extra="agents") from exc

__all__ = ["ChatstateSession"]


def _settings(value: SessionSettings | dict[str, Any] | None) -> SessionSettings:
    if value is None:
        return SessionSettings()
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(SessionSettings)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise TypeError(f"Unknown session settings: {', '.join(unknown)} (known: "
                            f"{', '.join(sorted(known))})")
        return SessionSettings(**value)
    return value


class ChatstateSession:
    """An Agents SDK ``Session`` whose items live in a chatstate store.

    ``session_id`` is the conversation id. ``store`` is a Store or a store URL
    (default: ``CHATSTATE_STORE`` or the platform default); a store opened from a
    URL is closed by ``close()``.
    """

    session_settings: SessionSettings | None = None

    def __init__(self, session_id: str, store: Store | str | None = None, *,
                 session_settings: SessionSettings | dict[str, Any] | None = None,
                 allow_ephemeral: bool = False) -> None:
        self.session_settings = _settings(session_settings)
        self._log = ItemLog(session_id, store, framework="openai-agents",
                            allow_ephemeral=allow_ephemeral)
        self.session_id = self._log.id

    @property
    def store(self) -> Store:
        return self._log.store

    async def get_items(self, limit: int | None = None, *,
                        wrapper: Any = None) -> list[Any]:
        """The latest ``limit`` items (default: ``session_settings.limit``, else all),
        oldest first; a call is always followed by its output (or an unknown one)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        items = await asyncio.to_thread(self._log.items)
        return list(_items.latest(_items.paired(items), limit))

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        """Append ``items`` in one durable, atomic append."""
        await asyncio.to_thread(self._log.add, list(items))

    async def pop_item(self, *, wrapper: Any = None) -> Any | None:
        """Hide the most recent item (an event in the chain) and return it; None if empty."""
        return await asyncio.to_thread(self._log.pop)

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Hide every item (an event in the chain; nothing is deleted)."""
        await asyncio.to_thread(self._log.clear)

    def open_calls(self) -> list[dict[str, Any]]:
        """Calls stored without their output: the turn a killed run left interrupted."""
        return self._log.open_calls()

    def close(self) -> None:
        self._log.close()
