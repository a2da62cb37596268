"""The s3 writer lease expires by the server's clock, not the writers' (issue 21 items 4, 13).

A writer's wall clock is moved with a monkeypatched ``time.time`` (the store reads
the server's clock from ``Last-Modified`` and carries it on a clock that does not
step, so only the old judgement, by ``until`` against ``time.time()``, is fooled).
"""

from __future__ import annotations

import re
import time

import pytest
from support.s3server import moto_endpoint, new_bucket_url

from chatstate.core.transcript import Conversation
from chatstate.errors import ConversationInUse
from chatstate.stores import open_store

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here

REAL = time.time


def skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    monkeypatch.setattr(time, "time", lambda: REAL() + seconds)


@pytest.mark.parametrize("ahead", [120.0, -120.0], ids=["taker-ahead", "holder-behind"])
def test_a_skewed_clock_cannot_take_a_live_lease(moto_endpoint: str, ahead: float,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url = new_bucket_url(moto_endpoint)
    holder, taker = open_store(url), open_store(url)
    holder.create(Conversation(id="c1"))
    if ahead < 0:
        skew(monkeypatch, ahead)  # the holder writes an until 120 s in everyone's past
    lease = holder.acquire_lease("c1", term=15)
    skew(monkeypatch, ahead if ahead > 0 else 0.0)  # the taker's clock 120 s ahead
    with pytest.raises(ConversationInUse) as info:
        taker.acquire_lease("c1", wait=0)
    # the timing is said on one clock (this process's), not local now against its until
    said = re.search(r"renewed ([\d.]+) s ago .* lapses (\d+) s after", str(info.value))
    assert said is not None, str(info.value)
    assert 0 <= float(said[1]) <= 15 and said[2] == "15", str(info.value)
    holder.renew_lease(lease)  # still the holder's
    holder.release_lease(lease)
    taker.release_lease(taker.acquire_lease("c1", wait=0))


def test_a_lapsed_lease_of_a_writer_whose_clock_is_ahead_is_taken(
        moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = new_bucket_url(moto_endpoint)
    holder, taker = open_store(url), open_store(url)
    holder.create(Conversation(id="c1"))
    skew(monkeypatch, 120.0)  # its until says 121 s from now on everyone else's clock
    holder.acquire_lease("c1", term=1.0)  # ...and it stops renewing
    skew(monkeypatch, 0.0)
    taken = taker.acquire_lease("c1", wait=10)  # the server's clock lets it lapse
    taker.release_lease(taken)
