"""`chatstate drill --encrypted --rekey` (issue 25, point 5: "the drill proves it"): after
the writer trials, real ``chatstate rekey`` processes are SIGKILLed at random moments while
writers append; each rotation is run to completion and proved from a fresh open with the
new key alone; the store ends under the drill's key, and the report says all of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_helpers import invoke
from support.drill_runs import drill
from support.s3server import moto_endpoint, new_bucket_url
from support.sealed import KEY, keyless, open_raw
from support.stores import new_conversation

from chatstate.stores import open_store
from chatstate.stores.codec import fingerprint_of, parse_key
from chatstate.stores.sealed import marker

pytestmark = pytest.mark.slow
__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here


@pytest.mark.invariant(4, 5)
def test_drill_rekey_kills_rekey_again_and_again_and_loses_nothing(
        local_store_url: str) -> None:
    _assert_rekey_drill(local_store_url)


def test_drill_rekey_refuses_a_store_with_other_conversations(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/shared.db"
    with keyless():
        store = open_store(url, key=parse_key(KEY, "t"))
        new_conversation(store, "my-own-chat", 2)
        store.close()
    done = invoke(["drill", "--store", url, "--encrypted", "--rekey", "--trials", "2"],
                  env={"CHATSTATE_ENCRYPTION_KEY": KEY})
    assert done.code != 0 and "re-encrypts the whole store" in done.err, done
    raw = open_raw(url)
    try:
        mark = marker(raw)
        assert mark is not None and mark["key"] == fingerprint_of(parse_key(KEY, "t"))
        assert "rekey" not in mark
        assert len(raw.load("my-own-chat").messages) == 2
    finally:
        raw.close()


def test_drill_rekey_needs_encrypted(tmp_path: Path) -> None:
    done = invoke(["drill", "--store", f"sqlite://{tmp_path}/d.db", "--rekey", "--trials", "1"])
    assert done.code == 2 and "--rekey goes with --encrypted" in done.err, done


def test_the_drill_checker_opens_an_encrypted_store_with_its_key(tmp_path: Path) -> None:
    """drill --encrypted's checker (and writers) open the store sealed: a plain record put
    in an encrypted store is corruption to it, and a sealed one is fine (they used to open
    it as stored, so the writers wrote plain records into an encrypted store unseen)."""
    from chatstate.drill.check import Checker, TrialLog
    from chatstate.drill.writer import make_adapter
    from chatstate.testing import FakeModel

    url = f"sqlite://{tmp_path}/enc.db"
    with keyless():
        sealed = open_store(url, key=parse_key(KEY, "t"))
        new_conversation(sealed, "drill-t-0", 2)
        sealed.close()
    raw = open_raw(url)
    try:
        new_conversation(raw, "drill-t-1", 2)  # plain records, behind the key's back
    finally:
        raw.close()
    with FakeModel() as fake:
        adapter = make_adapter(fake.base_url)
        try:
            checker = Checker(url, ["drill-t-0", "drill-t-1"], adapter)
            checker.key = parse_key(KEY, "t")
            tally = checker.check(TrialLog())
        finally:
            adapter.close()
    assert tally.corrupt == 1 and tally.lost == 0, tally
    assert any("drill-t-1" in p and "is not sealed" in p for p in tally.problems), tally.problems
    assert not any("drill-t-0" in p for p in tally.problems), tally.problems


@pytest.mark.invariant(4, 5)
def test_drill_rekey_on_s3_kills_rekey_again_and_again_and_loses_nothing(
        moto_endpoint: str) -> None:
    """s3 is re-keyed in place too (drill --rekey refused it before its first writer, when
    rekey had no in-place rewrite there): the phase runs on a bucket as on a local store."""
    url = new_bucket_url(moto_endpoint)
    _assert_rekey_drill(url)


def _assert_rekey_drill(url: str) -> None:
    """The rekey drill on ``url``: kills reached, nothing lost, back under the drill's key."""
    code, doc, err = drill(url, "--encrypted", "--rekey", "--trials", "4",
                           "--rekey-kills", "4", env={"CHATSTATE_ENCRYPTION_KEY": KEY})
    assert code == 0, f"exit {code}: {doc}\n{err}"
    assert doc["ok"] is True and doc["problems"] == [] and doc["problem_count"] == 0, doc
    assert (doc["lost"], doc["corrupt"], doc["duplicated"]) == (0, 0, 0), doc
    rekey = doc["rekey"]
    assert rekey["complete"] is True, rekey
    assert rekey["kills"] >= 4, rekey  # real SIGKILLs of a running rekey, reached
    assert sum(rekey["killed_when"].values()) == rekey["kills"], rekey
    assert rekey["rotations"] >= 2 and rekey["old_key_refused"] == rekey["rotations"], rekey
    assert rekey["writer_trials"] > 0 and rekey["acked"] > 0, rekey
    assert (rekey["lost"], rekey["corrupt"], rekey["duplicated"]) == (0, 0, 0), rekey
    assert doc["trials"] == 4 + rekey["writer_trials"] == sum(doc["kills"].values()), doc
    assert KEY not in err and KEY not in str(doc)
    raw = open_raw(url)  # back under the drill's key, nothing half-done
    try:
        mark = marker(raw)
        assert mark is not None and mark["key"] == fingerprint_of(parse_key(KEY, "t"))
        assert "rekey" not in mark
        assert [s.id for s in raw.list_conversations()] == ["chatstate.encryption"]
    finally:
        raw.close()
