"""What the list page shows of each stored conversation, worked out once per version.

A store's summaries hold a title, dates and a message count; the list also shows the
model, the token usage and the flags (interrupted, cut, forked, damaged), which need
the messages. A row is worked out by loading the conversation once and kept while
its summary (``updated_at``, ``message_count``) stays the same, so the second visit
to a page, and every page after a filter has loaded its rows, reads only summaries.
A page loads only the rows it shows (and, with a model filter, the rows it skips).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from chatstate.core.transcript import Conversation, ConversationSummary
from chatstate.errors import ChatstateError, ConversationNotFound
from chatstate.session.turn_state import cut_short_reply, interrupted_turn
from chatstate.stores.base import Searchable, Store

PAGE = 50


@dataclass
class Row:
    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    namespace: str = ""
    models: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    interrupted: bool = False  # the last turn has no complete reply (turn_state)
    cut: bool = False  # the last reply was stopped early: token limit, content filter
    forked_from: str | None = None
    damaged: str | None = None  # why it does not load


def namespace_of(conv: Conversation) -> str:
    """The namespace serve stored the conversation under ("": the default one)."""
    namespace = conv.metadata.get("namespace", "")
    return namespace if isinstance(namespace, str) else ""


def row_of(summary: ConversationSummary, conv: Conversation) -> Row:
    row = Row(summary.id, summary.title, summary.created_at, summary.updated_at,
              summary.message_count, namespace=namespace_of(conv))
    for message in conv.messages:
        if message.role == "assistant" and message.model and message.model not in row.models:
            row.models.append(message.model)
        used = message.usage or {}
        prompt, completion = used.get("prompt_tokens"), used.get("completion_tokens")
        row.prompt_tokens += prompt if isinstance(prompt, int) else 0
        row.completion_tokens += completion if isinstance(completion, int) else 0
    row.interrupted = interrupted_turn(conv) is not None  # as Chat and `list --check` say
    row.cut = cut_short_reply(conv) is not None
    origin = conv.metadata.get("forked_from")
    row.forked_from = str(origin.get("id")) if isinstance(origin, dict) else None
    return row


@dataclass
class Filters:
    q: str | None = None
    model: str | None = None
    since: str | None = None  # an ISO date: updated on or after
    until: str | None = None  # an ISO date: created on or before

    def by_summary(self, summary: ConversationSummary) -> bool:
        if self.since and summary.updated_at[:10] < self.since:
            return False
        return not (self.until and summary.created_at[:10] > self.until)


class Catalogue:
    """Rows for the list, read through a cache keyed on each summary's version."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._rows: dict[str, tuple[tuple[str, int], Row]] = {}
        self._guard = threading.Lock()

    @property
    def searchable(self) -> bool:
        return isinstance(self.store, Searchable)

    def row(self, summary: ConversationSummary) -> Row | None:
        """The summary's row (loaded when not cached); None when it was deleted meanwhile."""
        version = (summary.updated_at, summary.message_count)
        with self._guard:
            cached = self._rows.get(summary.id)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            row = row_of(summary, self.store.load(summary.id))
        except ConversationNotFound:
            return None
        except ChatstateError as exc:  # damaged: listed, flagged, never loaded over
            row = Row(summary.id, summary.title, summary.created_at, summary.updated_at,
                      summary.message_count, damaged=str(exc))
        with self._guard:
            self._rows[summary.id] = (version, row)
        return row

    def _summaries(self, filters: Filters) -> list[ConversationSummary]:
        summaries = self.store.list_conversations()
        if filters.q:
            assert isinstance(self.store, Searchable)
            hits = {cid for cid, _, _ in self.store.search(filters.q, limit=10_000)}
            summaries = [s for s in summaries if s.id in hits]
        return summaries

    def rows(self, filters: Filters, namespace: str | None) -> Iterator[Row]:
        """Every row that passes, newest first (lazily: a page takes what it shows)."""
        for summary in self._summaries(filters):
            if not filters.by_summary(summary):
                continue
            row = self.row(summary)
            if row is None:
                continue
            if namespace is not None and (row.damaged is not None or row.namespace != namespace):
                continue  # a damaged one's namespace is unknown: shown to the local user only
            if filters.model and filters.model not in row.models:
                continue
            yield row

    def page(self, filters: Filters, namespace: str | None, page: int,
             size: int = PAGE) -> tuple[list[Row], bool]:
        """Rows of page ``page`` (from 1) and whether there is a next one. Without a
        namespace or a model to check, the pages before it are skipped unloaded."""
        skip = (page - 1) * size
        if namespace is None and not filters.model:
            picked = [s for s in self._summaries(filters) if filters.by_summary(s)]
            rows = [r for r in (self.row(s) for s in picked[skip:skip + size]) if r]
            return rows, len(picked) > skip + size
        out: list[Row] = []
        for i, row in enumerate(self.rows(filters, namespace)):
            if i < skip:
                continue
            if len(out) == size:
                return out, True
            out.append(row)
        return out, False

    def models(self, namespace: str | None = None) -> list[str]:
        """The models of the rows worked out so far (the filter's choices), of
        ``namespace``'s conversations only when one is given (serve's /ui: another
        token's models are not this one's to see)."""
        with self._guard:
            rows = [row for _, row in self._rows.values()]
        return sorted({m for row in rows for m in row.models
                       if namespace is None or row.namespace == namespace})

    def children(self, conversation: Conversation, namespace: str | None) -> list[Row]:
        """The forks of a conversation: a fork's title starts with the title of what it
        copies (``fork`` adds " (fork)", serve keeps it), so only those are worked out
        (of an untitled one: those the list has worked out already)."""
        if conversation.title:
            summaries = [s for s in self.store.list_conversations()
                         if s.title.startswith(conversation.title) and s.id != conversation.id]
            rows = [self.row(s) for s in summaries]
        else:  # untitled: every conversation could be a fork; only the rows worked out
            with self._guard:
                rows = [row for _, row in self._rows.values()]
        return [r for r in rows if r is not None and r.forked_from == conversation.id
                and (namespace is None or r.namespace == namespace)]
