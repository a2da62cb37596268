"""The checker: after each kill, a fresh open of the store must show that nothing was lost.

It runs in the runner's process once the writer is dead and reaped (so never
in the process that wrote), on a store object opened afresh, which is
recovery. For every drill conversation:

- it loads and its hash chain verifies (else *corrupt*);
- every message any writer acknowledged, and every message a fresh open
  showed before, is there at its seq (else *lost*), once (else *duplicated*);
  no turn holds two user messages or two complete replies (*duplicated*);
- the text each writer rendered is a prefix of the turn's stored reply, the
  whole reply for turns it finished (else *lost*);
- a turn whose user message was acknowledged and whose reply was not stored
  complete is reported by ``Chat(...).interrupted`` under that turn id; then
  ``retry()`` completes it (*recovered*) and the conversation is checked again;
- no temp file and no lock is left (see ``leftovers``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chatstate.core.transcript import Conversation
from chatstate.drill._common import reopen
from chatstate.drill.leftovers import leftovers
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
)
from chatstate.stores.base import Store
from chatstate.stores.forwarding import ForwardingStore

LATE_WRITE_RETRIES = 3
LATE_WRITE_PAUSE = 0.2
"""How often, and after how long, the checker's retry of an interrupted turn is tried
again when the store says another writer changed it since the load (seconds)."""


@dataclass
class TrialLog:
    """What one writer reported before it died."""

    acks: list[tuple[str, int, str]] = field(default_factory=list)
    created: set[str] = field(default_factory=set)
    open_turns: dict[str, str] = field(default_factory=dict)  # cid -> turn with no reply acked
    rendered: dict[tuple[str, str], str] = field(default_factory=dict)
    ended: set[tuple[str, str]] = field(default_factory=set)
    error: str | None = None

    @classmethod
    def parse(cls, events: Sequence[list[Any]]) -> TrialLog:
        log = cls()
        for event in events:
            kind = event[0]
            if kind == "a" and event[1] == "create":
                log.created.add(event[2])
            elif kind == "a" and event[1] == "append":
                cid = event[2]
                for seq, hash_, turn_id, role in event[3]:
                    log.acks.append((cid, seq, hash_))
                    if role == "user":
                        log.open_turns[cid] = turn_id
                    elif role == "assistant" and log.open_turns.get(cid) == turn_id:
                        del log.open_turns[cid]
            elif kind == "d":
                key = (event[1], event[2])
                log.rendered[key] = log.rendered.get(key, "") + event[3]
            elif kind == "e":
                log.ended.add((event[1], event[2]))
            elif kind == "err":
                log.error = str(event[1])
        return log


@dataclass
class Tally:
    acked: int = 0
    lost: int = 0
    corrupt: int = 0
    duplicated: int = 0
    recovered: int = 0
    problems: list[str] = field(default_factory=list)


class Checker:
    """Remembers what was promised across trials and checks it after every kill.

    Each finding is counted once, in the trial that first sees it: a message
    lost in trial 3 is one lost message, not one per later trial.
    """

    def __init__(self, url: str, ids: Sequence[str], adapter: Any) -> None:
        self.url = url
        self.ids = list(ids)
        self.adapter = adapter
        # every promise, even two for one seq: at most one of those can be kept
        self.acked: dict[str, set[tuple[int, str]]] = {cid: set() for cid in ids}
        self.seen: dict[str, list[str]] = {cid: [] for cid in ids}
        self.exists: set[str] = set()
        self._flagged: set[tuple[Any, ...]] = set()
        self.key: bytes | Literal["env"] = "env"
        """What a fresh open is sealed by: the configured key, or these bytes (the rekey
        phase: the key of the rotation's side the check stands on)."""

    def check(self, log: TrialLog) -> Tally:
        tally = Tally(acked=len(log.acks))
        for cid, seq, hash_ in log.acks:
            self.acked[cid].add((seq, hash_))
        self.exists |= log.created
        store = reopen(self.url, self.key)
        try:
            convs = {cid: self._load(store, cid, tally) for cid in self.ids}
            counts = {cid: len(c.messages) for cid, c in convs.items() if c is not None}
            for text in leftovers(store, self.ids, counts):
                self._flag(tally, "", text)
            for cid, text in self._unsealed(store, [c for c, v in convs.items() if v]):
                self._flag(tally, "corrupt", text, cid, "unsealed")
            for conv in convs.values():
                if conv is not None:
                    self._conversation(store, conv, log, tally)
        finally:
            store.close()
        return tally

    def _unsealed(self, store: Store, ids: list[str]) -> list[tuple[str, str]]:
        """On an encrypted store: (cid, what) for each record of the conversations ``ids``
        not sealed by a key its mark names."""
        from chatstate.stores.sealed import SealedStore, marker

        if not isinstance(store, SealedStore):
            return []
        mark = marker(store.inner) or {}
        rot = mark.get("rekey")
        keys = {str(mark.get("key")), *([str(rot.get("from"))] if isinstance(rot, dict) else [])}
        return self.sealed_by(store.inner, keys, ids)

    def sealed_by(self, raw: Store, keys: set[str], ids: list[str] | None = None
                  ) -> list[tuple[str, str]]:
        """(cid, what) for each record of the drill's conversations (or ``ids``) in ``raw``
        (an encrypted store as stored) that is not sealed by one of ``keys``."""
        from chatstate.stores.rekey import record_keys

        found = []
        for cid in self.ids if ids is None else ids:
            try:
                stored = raw.load(cid)
            except ChatstateError:  # gone, or damage a sealed load names already
                continue
            for what, fp in record_keys(stored).items():
                if fp not in keys:
                    by = "not sealed" if fp is None else f"sealed by key {fp}"
                    found.append((cid, f"{cid}: its {what} is {by}, not by key "
                                       f"{' or '.join(sorted(keys))}"))
        return found

    def _flag(self, tally: Tally, counter: str, text: str, *key: Any) -> None:
        """Count ``counter`` (lost, corrupt, duplicated or "") and note ``text``, once per key."""
        ident = (counter, *key) if key else (counter, text)
        if ident in self._flagged:
            return
        self._flagged.add(ident)
        if counter:
            setattr(tally, counter, getattr(tally, counter) + 1)
        tally.problems.append(text)

    def _load(self, store: Store, cid: str, tally: Tally) -> Conversation | None:
        try:
            conv = store.load(cid)
        except ConversationNotFound:
            if cid in self.exists or self.acked[cid]:
                for seq, hash_ in sorted(self.acked[cid]):
                    self._flag(tally, "lost", f"{cid}: the conversation is gone, with "
                               f"acknowledged seq {seq}", cid, seq, hash_)
                self._flag(tally, "", f"{cid}: the conversation is gone")
            return None
        except CorruptTranscriptError as exc:
            self._flag(tally, "corrupt", f"{cid}: does not load: {exc}", cid, "load")
            return None
        self.exists.add(cid)
        return conv

    def _conversation(self, store: Store, conv: Conversation, log: TrialLog, tally: Tally) -> None:
        cid = conv.id
        if not self._verify(conv, tally):
            return
        self._rendered(conv, log, tally)
        from chatstate.session.chat import Chat

        # a forwarding wrapper (__getattr__): a Store in all but what mypy can see
        chat = Chat(_Preloaded(store, conv), conversation_id=cid, adapter=self.adapter,
                    flush_interval=0.0)
        turn = chat.interrupted
        pending = log.open_turns.get(cid)
        if pending is not None and not _complete(conv, pending) and \
                (turn is None or turn.turn_id != pending):
            self._flag(tally, "", f"{cid}: turn {pending} was cut off but is not reported as "
                       f"interrupted (interrupted: {turn.turn_id if turn else None})")
        if turn is None:
            return
        for attempt in range(LATE_WRITE_RETRIES + 1):
            try:
                chat.retry()
                again = chat.reload()
                break
            except ConflictError as exc:
                # a write the killed writer sent before its kill can land after the fresh
                # load (s3: the server finishes a request whose client is gone): reload and
                # retry, as the error says; a conflict that stays is a writer still alive
                if attempt == LATE_WRITE_RETRIES:
                    self._flag(tally, "", f"{cid}: retry() of turn {turn.turn_id} failed "
                               f"{attempt + 1} times: {exc}")
                    return
                time.sleep(LATE_WRITE_PAUSE)
                chat = Chat(store, conversation_id=cid, adapter=self.adapter,
                            flush_interval=0.0)
                if chat.interrupted is None:  # the late write ended it? then it is checked
                    again = chat.reload()
                    break
            except ChatstateError as exc:
                self._flag(tally, "", f"{cid}: retry() of turn {turn.turn_id} failed: {exc}")
                return
        for msg in again.messages[len(conv.messages):]:
            self.acked[cid].add((msg.seq, msg.hash))
        if self._verify(again, tally) and chat.interrupted is None and \
                _complete(again, turn.turn_id):
            tally.recovered += 1
        else:
            self._flag(tally, "", f"{cid}: retry() did not complete turn {turn.turn_id}")

    def _verify(self, conv: Conversation, tally: Tally) -> bool:
        """Chain, acknowledged and previously seen messages, duplicates. False if corrupt."""
        cid, messages = conv.id, conv.messages
        bad = conv.verify()
        if bad is not None:
            self._flag(tally, "corrupt", f"{cid}: hash chain breaks at seq {bad}", cid, "chain")
            return False
        hashes = [m.hash for m in messages]
        count = Counter(hashes)
        for seq, hash_ in sorted(self.acked[cid]):
            if seq >= len(messages) or hashes[seq] != hash_:
                self._flag(tally, "lost", f"{cid}: acknowledged seq {seq} ({hash_[:12]}) is "
                           "missing", cid, seq, hash_)
            elif count[hash_] > 1:
                self._flag(tally, "duplicated", f"{cid}: acknowledged seq {seq} is stored "
                           "twice", cid, seq, hash_)
        seen = self.seen[cid]
        for i, hash_ in enumerate(seen):
            if i >= len(hashes) or hashes[i] != hash_:
                self._flag(tally, "lost", f"{cid}: seq {i} ({hash_[:12]}), stored at an earlier "
                           "check, is gone", cid, i, hash_)
        if hashes[:len(seen)] == seen:
            self.seen[cid] = hashes
        users = Counter(m.turn_id for m in messages if m.role == "user")
        texts = Counter(m.content for m in messages if m.role == "user")
        replies = Counter(m.turn_id for m in messages
                          if m.role == "assistant" and m.status == "complete")
        for what, counter in (("user message", users), ("user text", texts),
                              ("complete reply", replies)):
            for key, n in counter.items():
                if n > 1:
                    self._flag(tally, "duplicated", f"{cid}: {what} {key[:40]!r} stored {n} "
                               "times", cid, what, key)
        return True

    def _rendered(self, conv: Conversation, log: TrialLog, tally: Tally) -> None:
        latest = {m.turn_id: m for m in conv.messages if m.role == "assistant"}
        if conv.partial is not None:
            latest[conv.partial.turn_id] = conv.partial
        for (cid, turn_id), text in log.rendered.items():
            if cid != conv.id:
                continue
            stored = latest.get(turn_id)
            content = stored.text if stored is not None else ""
            ended = (cid, turn_id) in log.ended
            if not content.startswith(text) or (ended and not _complete(conv, turn_id)):
                self._flag(tally, "lost", f"{cid}: turn {turn_id}: the writer rendered "
                           f"{len(text)} chars that the store does not hold (stored "
                           f"{len(content)} chars)", cid, "rendered", turn_id)


class _Preloaded(ForwardingStore):
    """The fresh store, whose first ``load`` of ``conv`` returns what the checker just loaded.

    So ``Chat`` judges exactly what the fresh open showed, without a second read
    (a load is a dozen requests on S3); every later call goes to the store.
    """

    def __init__(self, inner: Store, conv: Conversation) -> None:
        super().__init__(inner)
        self._conv: Conversation | None = conv

    def load(self, conversation_id: str) -> Conversation:
        conv, self._conv = self._conv, None
        if conv is not None and conv.id == conversation_id:
            return conv.model_copy()
        return super().load(conversation_id)


def _complete(conv: Conversation, turn_id: str) -> bool:
    return any(m.turn_id == turn_id and m.role == "assistant" and m.status == "complete"
               for m in conv.messages)
