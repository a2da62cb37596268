"""The header-less history index, read from the store when a request needs it.

Building the index by loading every stored conversation at start-up took 10.2 s
for 1,846 conversations. ``StoreIndex`` starts from the store's summaries only
(one listing: a header per conversation) and loads a conversation the first time a
request could continue it: a request's candidates are the stored conversations
with the title its first user message gives (``title_of``, as a new conversation is
titled; a fork keeps the title of the history it copies), each loaded once and then
kept like a conversation this process wrote. A damaged transcript is reported when
a request would have needed it, and never indexed over.

The same ``HistoryIndex`` API (``add``, ``find``, ``follower``, ``request``...):
``find`` loads the candidates, then looks them up in the request's namespace (a
loaded conversation's namespace is its own ``metadata.namespace``). A fork keeps the
title of the history it copies, so ``follower`` loads the title group of the
conversation it is asked about, and ``prime`` (called before a request is planned)
loads the groups a request could name: its own title's and its conversation id's,
which also brings in the request keys a retried request is replayed from.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from chatstate.serve._history import HistoryIndex
from chatstate.serve._turns import title_of
from chatstate.stores.base import Store

log = logging.getLogger("chatstate.serve")


class StoreIndex(HistoryIndex):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self._pending: dict[str, list[str]] = {}  # title -> ids not loaded yet
        self._titles: dict[str, str] = {}  # id -> title, from the summaries
        self._loading: dict[str, threading.Event] = {}
        self._guard = threading.Lock()

    def start(self) -> int:
        """Learn what is stored from its summaries (loads no conversation). How many."""
        pending: dict[str, list[str]] = {}
        summaries = self.store.list_conversations()
        for summary in reversed(summaries):  # oldest first: the newest is added last, wins
            pending.setdefault(summary.title, []).append(summary.id)
        with self._guard:
            self._titles.update({s.id: s.title for s in summaries})
            for title, ids in pending.items():
                self._pending.setdefault(title, [])[:0] = ids
        return len(summaries)

    def find(self, namespace: str, incoming: Sequence[Mapping[str, Any]]) -> str | None:
        if len(incoming) > 1:
            self._load(title_of(incoming))
        return super().find(namespace, incoming)

    def follower(self, conversation_id: str) -> str | None:
        self._load_of(conversation_id)
        return super().follower(conversation_id)

    def prime(self, conversation_id: str | None, incoming: Sequence[Mapping[str, Any]]
              ) -> None:
        """Load what planning this request could look up (blocking: store reads)."""
        self._load(title_of(incoming))
        if conversation_id is not None:
            self._load_of(conversation_id)

    def forget(self, conversation_id: str) -> None:
        with self._guard:
            title = self._titles.pop(conversation_id, None)
            if title is not None and conversation_id in self._pending.get(title, []):
                self._pending[title].remove(conversation_id)
        super().forget(conversation_id)

    def _load_of(self, conversation_id: str) -> None:
        with self._guard:
            title = self._titles.get(conversation_id)
        if title is not None:
            self._load(title)

    def _load(self, title: str) -> None:
        with self._guard:
            busy = self._loading.get(title)
            ids = [] if busy else self._pending.pop(title, [])
            if ids:
                done = self._loading[title] = threading.Event()
        if not ids:
            if busy is not None:
                busy.wait()  # another request is loading these candidates
            return
        try:
            for cid in ids:
                try:
                    self.add(self.store.load(cid))
                except Exception as exc:  # damaged: reported, never indexed over
                    log.warning("serve: not indexing %s: %s", cid, exc)
        finally:
            with self._guard:
                del self._loading[title]
            done.set()
