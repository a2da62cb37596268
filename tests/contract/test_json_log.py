"""The json store's append log: O(1) appends with one fsync, torn tails and damage told apart.

An append writes one checksummed record to the end of the conversation file (one
fsync, no rename, no directory fsync); closing the store compacts the records into
the document. A torn last record is an unacknowledged append: readers ignore it and
the next writer moves it into .quarantine/ and says so. A record that does not hold
with records after it is damage: named, never written over.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.stores import new_conversation, seal_chain

from chatstate.errors import CorruptTranscriptError
from chatstate.stores import open_store


def _logged(tmp_path: Path, n: int = 4) -> tuple[Any, Path, list[Any]]:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    msgs = new_conversation(store, "c1", n)
    return store, tmp_path / "store" / "c1.json", msgs


@pytest.mark.invariant(3)
def test_an_append_is_one_fsync_of_the_file_and_writes_only_its_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, path, msgs = _logged(tmp_path, 200)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    size = path.stat().st_size
    nxt = seal_chain(1, msgs[-1])
    store.append("c1", nxt)
    assert synced == [str(path)]  # the file itself, once; no directory, no temp file
    grown = path.stat().st_size - size
    assert grown < 1000, grown  # the record, not the transcript
    monkeypatch.undo()
    store.close()
    again = open_store(store.url)
    assert again.load("c1").messages == [*msgs, *nxt]
    assert path.read_bytes().endswith(b"\n]}\n")  # closing compacted it into the document


@pytest.mark.invariant(4, 7)
@pytest.mark.parametrize("torn", ["cut", "zeros", "garbled"])
def test_a_torn_last_record_is_an_unacknowledged_append(tmp_path: Path, torn: str) -> None:
    store, path, msgs = _logged(tmp_path)
    raw = path.read_bytes()
    cut = raw.rstrip(b"\n").rfind(b"\n") + 1  # the last record starts here
    record = raw[cut:]
    tail = {"cut": record[:len(record) // 2],
            "zeros": b"\0" * len(record),
            # its newline landed, a block of its middle did not
            "garbled": record[:20] + b"\0" * 100 + record[120:]}[torn]
    path.write_bytes(raw[:cut] + tail)
    reader = open_store(store.url)
    assert reader.load("c1").messages == msgs[:3]  # the torn append is not there
    assert reader.list_conversations()[0].message_count == 3
    nxt = seal_chain(1, msgs[2])
    reader.append("c1", nxt)  # the writer sets the torn bytes aside, then appends
    assert reader.load("c1").messages == [*msgs[:3], *nxt]
    kept = list((tmp_path / "store" / ".quarantine").glob("c1.torn-record.*"))
    assert [p.read_bytes() for p in kept] == [tail]
    assert any("torn last record" in line for line in reader.recovery), reader.recovery
    reader.close()
    store.close()


@pytest.mark.invariant(4, 7)
@pytest.mark.parametrize("write", ["set_header", "rewrite"])
def test_every_write_that_replaces_the_file_keeps_a_torn_last_record_aside(
        tmp_path: Path, write: str) -> None:
    # not only the append's compaction: a retitle or a rekey's rewrite writes the file
    # anew too, and dropped the torn bytes unseen
    store, path, msgs = _logged(tmp_path)
    raw = path.read_bytes()
    cut = raw.rstrip(b"\n").rfind(b"\n") + 1
    tail = raw[cut:][:40]
    path.write_bytes(raw[:cut] + tail)
    reader = open_store(store.url)
    if write == "set_header":
        reader.set_header("c1", title="renamed")
    else:
        kept_msgs = reader.load("c1").messages
        reader.rewrite("c1", kept_msgs, expect=kept_msgs[-1].hash)
    assert tail not in path.read_bytes()
    kept = list((tmp_path / "store" / ".quarantine").glob("c1.torn-record.*"))
    assert [p.read_bytes() for p in kept] == [tail]
    assert any("torn last record" in line for line in reader.recovery), reader.recovery
    assert open_store(store.url).load("c1").messages == msgs[:3]


@pytest.mark.invariant(6)
@pytest.mark.parametrize(("seq", "how"), [(1, "edited"), (1, "cut"), (3, "edited")])
def test_a_bad_record_before_the_last_or_an_edited_one_is_damage_and_left_alone(
        tmp_path: Path, seq: int, how: str) -> None:
    """Before the last, any bad record; the last one too when it is whole, valid JSON
    and fails its checksum (edited: no crash makes that)."""
    store, path, msgs = _logged(tmp_path)
    raw = path.read_bytes()
    damaged = (raw.replace(b'"msg %d"' % seq, b'"msg X"') if how == "edited" else
               raw.replace(b'"msg %d"' % seq, b'"msg'))
    path.write_bytes(damaged)
    fresh = open_store(store.url)
    for attempt in (lambda: fresh.load("c1"),
                    lambda: fresh.append("c1", seal_chain(1, msgs[-1])),
                    lambda: fresh.set_header("c1", title="over it?")):
        with pytest.raises(CorruptTranscriptError) as info:
            attempt()
        assert info.value.position == seq
        assert str(path) in str(info.value)
    fresh.close()
    store.close()  # its compaction verifies first, and refuses
    assert path.read_bytes() == damaged
    assert any("not compacted" in line for line in store.recovery)


def test_a_document_without_records_still_loads_and_takes_appends(tmp_path: Path) -> None:
    store, path, msgs = _logged(tmp_path)
    store.close()
    document = path.read_bytes()  # compacted: the single-document format of every version
    assert document.endswith(b"\n]}\n") and document.count(b"\t") == 0
    again = open_store(store.url)
    assert again.load("c1").messages == msgs
    nxt = seal_chain(2, msgs[-1])
    again.append("c1", nxt[:1])
    again.append("c1", nxt[1:])
    assert path.read_bytes().startswith(document[:-1])  # appended after it, in place
    summary = again.list_conversations()[0]
    assert summary.message_count == 6
    assert open_store(store.url).load("c1").messages == [*msgs, *nxt]
    again.close()


def test_the_log_is_compacted_once_it_outgrows_the_document(tmp_path: Path) -> None:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    store.log_limit = 4096
    msgs = new_conversation(store, "c1", 60)
    raw = (tmp_path / "store" / "c1.json").read_bytes()
    log = raw[raw.find(b"\n]}\n") + 4:]
    assert 0 < len(log) <= max(4096, len(raw) - len(log)) + 1000
    assert open_store(url).load("c1").messages == msgs
    store.close()


KILLED_WRITER = """
import os, signal, sys
from chatstate.stores import open_store
from chatstate.testing.store_contract import new_conversation
store = open_store(sys.argv[1])
new_conversation(store, "c1", 5)
with open(store.root / "c1.json", "ab") as fh:  # and an append cut off half-way
    fh.write(b'{"schema":1,"at":"2026-01-01T00:00:00Z","messages":[{"seq":5')
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.invariant(7)
def test_the_next_writer_reconciles_the_log_of_a_killed_writer(tmp_path: Path) -> None:
    """Open loads no conversation (serve starts without reading them); readers ignore
    the torn append; the next writer sets it aside, says so, and compacts."""
    import subprocess
    import sys

    url = f"json://{tmp_path}/store"
    child = subprocess.run([sys.executable, "-c", KILLED_WRITER, url], capture_output=True,
                           text=True, timeout=60, check=False)
    assert child.returncode == -9, child.stderr
    path = tmp_path / "store" / "c1.json"
    store = open_store(url)
    conv = store.load("c1")
    assert [m.content for m in conv.messages] == [f"msg {i}" for i in range(5)]
    assert store.list_conversations()[0].message_count == 5
    nxt = seal_chain(1, conv.messages[-1])
    store.append("c1", nxt)
    assert any("torn last record" in line for line in store.recovery), store.recovery
    raw = path.read_bytes()  # compacted, then the one new record appended
    assert raw.count(b"\t") == 1 and raw.endswith(b"\n"), raw[-200:]
    store.close()
    again = open_store(url).load("c1")
    assert again.messages == [*conv.messages, *nxt]
    assert again.verify() is None


def test_closing_after_delete_or_quarantine_reports_nothing(tmp_path: Path) -> None:
    store, _, _ = _logged(tmp_path)
    new_conversation(store, "c2", 2)
    store.delete("c1")
    store.quarantine("c2")
    store.close()
    assert store.recovery == []
