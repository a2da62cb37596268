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

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ChatstateError, ConversationNotFound, CorruptTranscriptError
from ..transcript import Conversation
from ._common import reopen
from .leftovers import leftovers


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
    """Remembers what was promised across trials and checks it after every kill."""

    def __init__(self, url: str, ids: Sequence[str], adapter: Any) -> None:
        self.url = url
        self.ids = list(ids)
        self.adapter = adapter
        self.acked: dict[str, dict[int, str]] = {cid: {} for cid in ids}
        self.seen: dict[str, list[str]] = {cid: [] for cid in ids}
        self.exists: set[str] = set()

    def check(self, log: TrialLog) -> Tally:
        tally = Tally(acked=len(log.acks))
        for cid, seq, hash_ in log.acks:
            self.acked[cid][seq] = hash_
        self.exists |= log.created
        store = reopen(self.url)
        try:
            convs = {cid: self._load(store, cid, tally) for cid in self.ids}
            counts = {cid: len(c.messages) for cid, c in convs.items() if c is not None}
            tally.problems += leftovers(store, self.ids, counts)
            for conv in convs.values():
                if conv is not None:
                    self._conversation(store, conv, log, tally)
        finally:
            store.close()
        return tally

    def _load(self, store: Any, cid: str, tally: Tally) -> Conversation | None:
        try:
            conv: Conversation = store.load(cid)
        except ConversationNotFound:
            if cid in self.exists or self.acked[cid]:
                tally.lost += len(self.acked[cid])
                tally.problems.append(f"{cid}: the conversation is gone")
            return None
        except CorruptTranscriptError as exc:
            tally.corrupt += 1
            tally.problems.append(f"{cid}: does not load: {exc}")
            return None
        self.exists.add(cid)
        return conv

    def _conversation(self, store: Any, conv: Conversation, log: TrialLog, tally: Tally) -> None:
        cid = conv.id
        if not self._verify(conv, tally):
            return
        self._rendered(conv, log, tally)
        from ..session import Chat

        chat = Chat(store, conversation_id=cid, adapter=self.adapter, flush_interval=0.0)
        turn = chat.interrupted
        pending = log.open_turns.get(cid)
        if pending is not None and not _complete(conv, pending) and \
                (turn is None or turn.turn_id != pending):
            tally.problems.append(f"{cid}: turn {pending} was cut off but is not reported "
                                  f"as interrupted (interrupted: {turn})")
        if turn is None:
            self.seen[cid] = [m.hash for m in conv.messages]
            return
        try:
            chat.retry()
            again = store.load(cid)
        except ChatstateError as exc:
            tally.problems.append(f"{cid}: retry() of turn {turn.turn_id} failed: {exc}")
            return
        for msg in again.messages[len(conv.messages):]:
            self.acked[cid][msg.seq] = msg.hash
        if self._verify(again, tally) and again.messages and \
                Chat(store, conversation_id=cid, adapter=self.adapter).interrupted is None \
                and _complete(again, turn.turn_id):
            tally.recovered += 1
        else:
            tally.problems.append(f"{cid}: retry() did not complete turn {turn.turn_id}")

    def _verify(self, conv: Conversation, tally: Tally) -> bool:
        """Chain, acknowledged and previously seen messages, duplicates. False if corrupt."""
        cid, messages = conv.id, conv.messages
        bad = conv.verify()
        if bad is not None:
            tally.corrupt += 1
            tally.problems.append(f"{cid}: hash chain breaks at seq {bad}")
            return False
        hashes = [m.hash for m in messages]
        count = Counter(hashes)
        for seq, hash_ in sorted(self.acked[cid].items()):
            if seq >= len(messages) or hashes[seq] != hash_:
                tally.lost += 1
                tally.problems.append(f"{cid}: acknowledged seq {seq} ({hash_[:12]}) is missing")
            elif count[hash_] > 1:
                tally.duplicated += 1
                tally.problems.append(f"{cid}: acknowledged seq {seq} is stored twice")
        seen = self.seen[cid]
        if hashes[:len(seen)] != seen:
            gone = sum(1 for i, h in enumerate(seen) if i >= len(hashes) or hashes[i] != h)
            tally.lost += gone
            tally.problems.append(f"{cid}: {gone} message(s) a fresh open showed before are gone")
        users = Counter(m.turn_id for m in messages if m.role == "user")
        texts = Counter(m.content for m in messages if m.role == "user")
        replies = Counter(m.turn_id for m in messages
                          if m.role == "assistant" and m.status == "complete")
        for what, counter in (("user message", users), ("user text", texts),
                              ("complete reply", replies)):
            for key, n in counter.items():
                if n > 1:
                    tally.duplicated += n - 1
                    tally.problems.append(f"{cid}: {what} {key[:40]!r} stored {n} times")
        return True

    def _rendered(self, conv: Conversation, log: TrialLog, tally: Tally) -> None:
        latest = {m.turn_id: m for m in conv.messages if m.role == "assistant"}
        if conv.partial is not None:
            latest[conv.partial.turn_id] = conv.partial
        for (cid, turn_id), text in log.rendered.items():
            if cid != conv.id:
                continue
            stored = latest.get(turn_id)
            content = stored.content if stored is not None else ""
            ended = (cid, turn_id) in log.ended
            if not content.startswith(text) or (ended and not _complete(conv, turn_id)):
                tally.lost += 1
                tally.problems.append(
                    f"{cid}: turn {turn_id}: the writer rendered {len(text)} chars that the "
                    f"store does not hold (stored {len(content)} chars)")


def _complete(conv: Conversation, turn_id: str) -> bool:
    return any(m.turn_id == turn_id and m.role == "assistant" and m.status == "complete"
               for m in conv.messages)
