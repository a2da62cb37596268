"""Full-text search on an encrypted store, opted in: a keyed index (issue 25, point 2).

Off unless ``CHATSTATE_ENCRYPTED_SEARCH=keyed``. The index is a hidden conversation of
the store itself (``chatstate.search-index``, one per store, hidden by the sealed store
like the encryption mark), an append-only chain of index records. Each record holds,
for the messages indexed since the one before it, a posting list per word:
``HMAC-SHA256(index key, word)`` (cut to 128 bits) -> ``[conversation id, seq]``, where
a word is a run of letters and digits after NFKC normalisation and case folding, and
the index key is derived from the encryption key. No word, and no unkeyed digest of
one, is stored. A search brings the index up to date first (the messages appended
since, opened with the key: the same catch-up sqlite's FTS5 index does), then looks
the query's words up (all of them, whole words), opens the messages found and checks
them, so a stale or colliding entry never shows.

What it leaks, to whoever reads the store, is in docs/encryption.md: which messages
share a word, how many distinct words each has and how often each (keyed) word
occurs, and, from successive versions of the index, when messages were indexed.
The lookups themselves happen in this process (the whole index is read), so queries
are not shown to the operator except by their timing.

The index names the key (fingerprint) it was built under: after ``rekey`` it is
rebuilt under the new key on the next search.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConfigurationError, ConflictError, ConversationNotFound, Unsupported
from chatstate.stores.base import Store

INDEX_ID = "chatstate.search-index"
SETTING = "CHATSTATE_ENCRYPTED_SEARCH"
PART = "chatstate.keyed-index"
TOKEN_HEX = 32
_WORD = re.compile(r"\w+")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Is the keyed index opted in (``CHATSTATE_ENCRYPTED_SEARCH=keyed``)?"""
    value = (os.environ if env is None else env).get(SETTING, "").strip().lower()
    if value in ("", "off", "0", "no"):
        return False
    if value != "keyed":
        raise ConfigurationError(f"{SETTING}={value!r}: the only value is 'keyed' (a keyed "
                                 "index; see docs/encryption.md for what it leaks), or unset "
                                 "it to keep search off")
    return True


def refused(url: str) -> Unsupported:
    return Unsupported(f"{url} is encrypted: full-text search is off, because a plain index "
                       f"would keep the words of every message in the clear. Opt in to a "
                       f"keyed index with {SETTING}=keyed (it reveals which messages share a "
                       "word and how often words occur: docs/encryption.md), or read a "
                       "conversation with `chatstate replay ID`")


def words(text: str) -> set[str]:
    """The normalised whole words of ``text``."""
    return set(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


class KeyedIndex:
    """The keyed index of one sealed store (``sealed``: a ``SealedStore``)."""

    def __init__(self, sealed: Any) -> None:
        self.sealed = sealed
        self.inner: Store = sealed.inner
        self.fingerprint: str = sealed.codec.fingerprint
        self._key: bytes = sealed.codec.subkey("search-index")

    def token(self, word: str) -> str:
        return hmac.new(self._key, word.encode("utf-8", "surrogatepass"),
                        hashlib.sha256).hexdigest()[:TOKEN_HEX]

    # -- the stored index -----------------------------------------------------------
    def _load(self) -> Conversation:
        """The index conversation, made (or made again, for another key) when needed."""
        try:
            conv = self.inner.load(INDEX_ID)
        except ConversationNotFound:
            conv = None
        if conv is not None and conv.metadata.get("key") == self.fingerprint:
            return conv
        if conv is not None:  # built under another key (before a rekey): rebuilt
            self.inner.delete(INDEX_ID)
        with contextlib.suppress(ConflictError):  # another process made it first
            self.inner.create(Conversation(
                id=INDEX_ID, title="chatstate: keyed search index (HMAC of words, no text)",
                metadata={"key": self.fingerprint, "format": 1}))
        loaded: Conversation = self.inner.load(INDEX_ID)
        return loaded

    @staticmethod
    def _state(conv: Conversation) -> tuple[dict[str, str], dict[str, int],
                                            dict[str, set[tuple[str, int]]]]:
        """(generation, indexed count, postings) per conversation, from the records."""
        gens: dict[str, str] = {}
        upto: dict[str, int] = {}
        postings: dict[str, set[tuple[str, int]]] = {}
        for msg in conv.messages:
            part = msg.content[0] if isinstance(msg.content, list) and msg.content else {}
            if not isinstance(part, dict) or part.get("type") != PART:
                continue
            for cid, gen in part.get("docs", {}).items():
                if gens.get(cid) != gen:  # deleted and made again: its old entries go
                    for held in postings.values():
                        held.difference_update({e for e in held if e[0] == cid})
                gens[cid] = gen
                upto[cid] = int(part.get("upto", {}).get(cid, 0))
            for tok, entries in part.get("postings", {}).items():
                postings.setdefault(tok, set()).update((str(c), int(s)) for c, s in entries)
        return gens, upto, postings

    def catch_up(self) -> dict[str, set[tuple[str, int]]]:
        """Index every message appended since the last search; the postings."""
        for _ in range(5):
            conv = self._load()
            gens, upto, postings = self._state(conv)
            docs: dict[str, str] = {}
            counts: dict[str, int] = {}
            fresh: dict[str, list[list[Any]]] = {}
            for summary in self.sealed.list_conversations():
                cid, gen = summary.id, summary.created_at
                have = upto.get(cid, 0) if gens.get(cid) == gen else 0
                if summary.message_count <= have and gens.get(cid) == gen:
                    continue
                try:
                    messages = self.sealed.load(cid).messages
                except ConversationNotFound:
                    continue
                for msg in messages[have:]:
                    for word in words(msg.text):
                        fresh.setdefault(self.token(word), []).append([cid, msg.seq])
                docs[cid], counts[cid] = gen, len(messages)
            if not docs:
                return postings
            last = conv.messages[-1] if conv.messages else None
            record = Message.seal(last, role="event", turn_id="index", content=[{
                "type": PART, "docs": docs, "upto": counts, "postings": fresh}])
            try:
                self.inner.append(INDEX_ID, [record])
            except ConflictError:
                continue  # another process indexed first: read it again
            return self._state(conv.model_copy(update={
                "messages": [*conv.messages, record]}))[2]
        raise ConflictError(f"{self.inner.url}: the search index kept changing while it was "
                            "brought up to date; search again")

    # -- search ---------------------------------------------------------------------
    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        wanted = words(text)
        postings = self.catch_up()
        if not wanted:
            return []
        found: set[tuple[str, int]] | None = None
        for word in wanted:
            entries = postings.get(self.token(word), set())
            found = set(entries) if found is None else found & entries
        hits: list[tuple[str, int, str]] = []
        opened: dict[str, list[Message]] = {}
        for cid, seq in sorted(found or ()):
            if len(hits) >= limit:
                break
            if cid not in opened:
                try:
                    opened[cid] = self.sealed.load(cid).messages
                except ConversationNotFound:
                    opened[cid] = []
            messages = opened[cid]
            if seq < len(messages) and wanted <= words(messages[seq].text):
                hits.append((cid, seq, messages[seq].text))
        return hits
