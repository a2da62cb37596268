"""The s3 store's commit point is the segment PUT (issue 21 item 8).

When only what follows it fails (the index update, the delete of the partial reply
the append kept, the snapshot), the message is stored: the append returns, the
message loads back, and the next append goes on with no conflict. The derived data
is repaired later (load and the next append move the index forward).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from support.s3server import FaultProxy, make_bucket, moto_endpoint, s3_url

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store
from chatstate.testing.store_contract import seal_chain

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here

FAILS = {  # (method, path part) of the derived write that fails, every retry of it
    "index": ("PUT", "/index/"),
    "partial delete": ("POST", "?delete"),
    "snapshot": ("PUT", "/snap/"),
}


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    p = FaultProxy(moto_endpoint).start()
    yield p
    p.stop()


@pytest.mark.parametrize("derived", sorted(FAILS))
def test_a_failure_after_the_segment_landed_is_not_a_failed_append(
        proxy: FaultProxy, moto_endpoint: str, derived: str,
        caplog: pytest.LogCaptureFixture) -> None:
    url = s3_url(proxy.endpoint, make_bucket(moto_endpoint))
    store = open_store(url)
    store.create(Conversation(id="c1"))
    before = seal_chain(63 if derived == "snapshot" else 1)  # the next seq ends block 0
    store.append("c1", before)
    reply = Message.seal(before[-1], role="assistant", content="stored", turn_id="t-r")
    store.save_partial("c1", Message.seal(before[-1], role="assistant", content="sto",
                                          turn_id="t-r", status="partial"))
    method, part = FAILS[derived]
    proxy.fail(500, 6, method=method, path_contains=part)  # the first try and every retry
    with caplog.at_level(logging.WARNING, logger="chatstate.stores"):
        store.append("c1", [reply])  # returns: the message is stored
    assert proxy._take(method, part) is None, "the fault did not fire"
    assert "the append is stored, but could not" in caplog.text
    assert open_store(url).load("c1").messages[-1] == reply
    ask = Message.seal(reply, role="user", content="next", turn_id="t-n")
    store.append("c1", [ask])  # no ConflictError blaming another writer
    store.save_partial("c1", Message.seal(ask, role="assistant", content="ha", turn_id="t-n",
                                          status="partial"))
    answer = Message.seal(ask, role="assistant", content="half", turn_id="t-n")
    store.append("c1", [answer])
    again = open_store(url)
    conv = again.load("c1")
    assert conv.messages[-3:] == [reply, ask, answer]
    assert conv.partial is None
    assert again.list_conversations()[0].message_count == len(before) + 3  # index repaired
