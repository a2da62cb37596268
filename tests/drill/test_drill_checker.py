"""The drill's checker (``chatstate.drill.check``) against what a killed writer leaves."""

from __future__ import annotations

from typing import Any

import pytest
from support.stores import new_conversation

from chatstate.core.transcript import Message
from chatstate.drill import check
from chatstate.drill.check import Checker, TrialLog
from chatstate.drill.writer import make_adapter
from chatstate.stores import open_store
from chatstate.stores.base import Store
from chatstate.stores.forwarding import ForwardingStore
from chatstate.testing import FakeModel


class _LateWrite(ForwardingStore):
    """The checker's fresh store, where the killed writer's last ``save_partial`` (a
    request it sent before its kill) lands after the load, before the retry appends."""

    def __init__(self, inner: Store, late: Message) -> None:
        super().__init__(inner)
        self.late: Message | None = late

    def append(self, conversation_id: str, messages: Any, **kw: Any) -> Any:
        late, self.late = self.late, None
        if late is not None:
            other = open_store(self.inner.url)
            try:
                other.save_partial(conversation_id, late)
            finally:
                other.close()
        return super().append(conversation_id, messages, **kw)


def test_a_write_landing_after_the_checkers_load_is_reloaded_not_a_problem(
        local_store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3 finishes a request whose client was SIGKILLed; the drill on s3 then saw its retry
    refused ("the partial reply at seq 4 changed since it was loaded") and failed with
    nothing lost. The retry is run again on a fresh load, as the error says."""
    store = open_store(local_store_url)
    try:
        user = new_conversation(store, "drill-x-0", 1)[-1]
        store.save_partial("drill-x-0", Message.seal(
            user, role="assistant", content="half", turn_id="t-1", status="partial"))
    finally:
        store.close()
    late = Message.seal(user, role="assistant", content="half a reply", turn_id="t-1",
                        status="partial")
    reopen = check.reopen
    monkeypatch.setattr(check, "reopen", lambda url, key: _LateWrite(reopen(url, key), late))
    monkeypatch.setattr(check, "LATE_WRITE_PAUSE", 0.0)
    with FakeModel() as fake:
        adapter = make_adapter(fake.base_url)
        try:
            tally = Checker(local_store_url, ["drill-x-0"], adapter).check(TrialLog())
        finally:
            adapter.close()
    assert tally.problems == [] and tally.recovered == 1, tally
    store = open_store(local_store_url)
    try:
        conv = store.load("drill-x-0")
    finally:
        store.close()
    assert conv.partial is None and [m.status for m in conv.messages] == \
        ["complete", "partial", "complete"], conv.messages
    assert conv.messages[1].content == "half a reply"  # the late write's, kept
