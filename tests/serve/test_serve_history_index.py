"""The proxy's history index (``serve/_history.HistoryIndex``): a turn's commit digests
the new messages only, and the digest is the one the whole history gives."""

from __future__ import annotations

import pytest

from chatstate.core.transcript import Conversation, Message
from chatstate.serve import _history
from chatstate.serve._history import HistoryIndex, history_digest, stored_form, visible


def _grown(conv: Conversation, *texts: str, status: str = "complete") -> Conversation:
    messages = list(conv.messages)
    for text in texts:
        role = "user" if len(messages) % 2 == 0 else "assistant"
        messages.append(Message.seal(messages[-1] if messages else None, role=role,
                                     content=text, turn_id=f"t-{len(messages) // 2}",
                                     status=status))
    return conv.model_copy(update={"messages": messages})


def test_an_add_after_a_turn_digests_its_new_messages_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[str] = []
    real = _history._step
    monkeypatch.setattr(_history, "_step", lambda digest, form: steps.append(
        form["content"]) or real(digest, form))
    index = HistoryIndex()
    conv = _grown(Conversation(id="c"), *(f"m{i}" for i in range(40)))
    index.add(conv)
    assert len(steps) == 40
    steps.clear()
    conv = _grown(conv, "cut", status="partial")  # a cut-off reply: not in the history
    conv = _grown(conv, "q40", "a40")
    index.add(conv)
    assert steps == ["q40", "a40"]  # not the 40 before them again
    forms = [stored_form(m) for m in visible(conv)]
    assert index.find("", [*forms, {"role": "user", "content": "next"}]) == "c"
    assert history_digest(forms) in {d for (_, d) in index._ids}


def test_a_conversation_rewritten_meanwhile_is_digested_again() -> None:
    """The carried digest is used only while the messages digested are still there (the
    chain hash of the last one vouches for all before it): a conversation whose earlier
    messages changed (a rekey, another writer's rewrite) is indexed by what it holds."""
    index = HistoryIndex()
    index.add(_grown(Conversation(id="c"), "hello", "hi"))
    other = _grown(Conversation(id="c"), "HELLO", "hi", "more", "yes")
    index.add(other)
    forms = [stored_form(m) for m in visible(other)]
    assert index.find("", [*forms, {"role": "user", "content": "next"}]) == "c"
    assert history_digest(forms) in {d for (_, d) in index._ids}
