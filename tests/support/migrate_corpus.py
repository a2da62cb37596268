"""A corpus of conversations for migrate and transfer tests: built, then compared whole."""

from __future__ import annotations

from typing import Any

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store

# id -> (turns, with a partial reply, metadata)
CORPUS: dict[str, tuple[int, bool, dict[str, Any]]] = {
    "alpha": (100, False, {}),
    "beta": (30, True, {"model": "fake", "tags": ["x"]}),
    "gamma": (1, False, {}),
    "delta": (0, True, {}),
    "eps.v2_x": (50, False, {"note": "ünïcödé ✓"}),
}
TOTAL = sum(2 * turns for turns, _, _ in CORPUS.values())


def local(url: str) -> Any:
    # the guard is not under test here: tmp_path may be under /tmp without --basetemp
    return open_store(url, allow_ephemeral=True)


def build_corpus(store: Any) -> None:
    for cid, (turns, partial, metadata) in CORPUS.items():
        store.create(Conversation(id=cid, title=f"Title of {cid}", metadata=metadata))
        prev: Message | None = None
        for turn in range(turns):
            user = Message.seal(prev, role="user", content=f"{cid} question {turn} ✓",
                                turn_id=f"t-{cid}-{turn}")
            prev = Message.seal(user, role="assistant", content=f"answer {turn}\nline 2",
                                turn_id=user.turn_id, model="fake",
                                usage={"prompt_tokens": turn, "completion_tokens": 3})
            store.append(cid, [user, prev] if turn % 3 else [user])
            if turn % 3 == 0:
                store.append(cid, [prev])
        if partial:
            user = Message.seal(prev, role="user", content="unanswered", turn_id="t-open")
            store.append(cid, [user])
            store.save_partial(cid, Message.seal(user, role="assistant", content="half a rep",
                                                 turn_id="t-open", status="partial"))


def state(store: Any) -> dict[str, Any]:
    """Everything migrate promises to carry, per conversation."""
    out = {}
    for summary in store.list_conversations():
        conv = store.load(summary.id)
        assert conv.verify() is None
        out[conv.id] = (conv.title, conv.metadata, [m.hash for m in conv.messages],
                        conv.partial.body() if conv.partial else None)
    return out
