"""One store object shared by threads, as ``serve`` and ``AsyncChat`` share it (see ``Store``).

Proves, per store: threads calling one store object at once, each streaming turns
into its own conversation (append, partial save, append of the reply) and all
racing compare-and-append on a shared one, lose nothing and mix nothing up: each
conversation holds exactly its acknowledged messages with a verifying chain, no
partial is left, and the shared one holds exactly the appends that returned.
"""

from __future__ import annotations

import threading
from typing import Any

from support.stores import new_conversation

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConflictError

THREADS = 6
TURNS = 4


def test_threads_share_one_store_object(store: Any) -> None:
    new_conversation(store, "shared")
    start = threading.Barrier(THREADS)
    won: list[Message] = []
    failures: list[BaseException] = []

    def turns(n: int) -> None:
        cid = f"own{n}"
        start.wait()
        store.create(Conversation(id=cid))
        prev = None
        for turn in range(TURNS):
            prev = Message.seal(prev, role="user", content=f"{n}.{turn}", turn_id=f"t{turn}")
            store.append(cid, [prev])
            reply = Message.seal(prev, role="assistant", content=f"re {n}.{turn}",
                                 turn_id=f"t{turn}")
            store.save_partial(cid, Message.seal(prev, role="assistant", status="partial",
                                                 content="re", turn_id=f"t{turn}"))
            store.append(cid, [reply])
            prev = reply
            while True:  # the shared conversation: load, seal after its last, append
                last = store.load("shared").last
                msg = Message.seal(last, role="user", content=f"{n} says {turn}",
                                   turn_id=f"s{n}.{turn}")
                try:
                    store.append("shared", [msg])
                except ConflictError:
                    continue  # another thread took that seq; nothing of ours was written
                won.append(msg)
                break

    def run(n: int) -> None:
        try:
            turns(n)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert failures == []
    for n in range(THREADS):
        conv = store.load(f"own{n}")
        assert conv.verify() is None
        assert conv.partial is None
        assert [m.content for m in conv.messages] == [
            text for turn in range(TURNS) for text in (f"{n}.{turn}", f"re {n}.{turn}")]
    shared = store.load("shared")
    assert shared.verify() is None
    assert len(shared.messages) == THREADS * TURNS
    assert sorted(m.hash for m in shared.messages) == sorted(m.hash for m in won)
    assert {s.id for s in store.list_conversations()} == {
        "shared", *(f"own{n}" for n in range(THREADS))}
