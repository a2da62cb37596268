"""The json store's partial reply is an append-only log: one fsync per flush.

A flush appends one whole record and its newline; a torn last line (a killed
append) is ignored in favour of the record before it, and the file is rewritten
whole whenever this process cannot vouch for its tail.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.faultlib import require_tool

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConflictError
from chatstate.stores import open_store


def partial_after(prev: Message | None, text: str) -> Message:
    return Message.seal(prev, role="assistant", content=text, turn_id="t1", status="partial")


def setup_store(tmp_path: Path) -> tuple[str, Message, Path]:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    store.create(Conversation(id="c1"))
    user = Message.seal(None, role="user", content="hi", turn_id="t1")
    store.append("c1", [user])
    store.close()
    return url, user, tmp_path / "store" / ".partials" / "c1.json"


def test_flushes_append_lines_and_the_last_one_wins(tmp_path: Path) -> None:
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)
    for n in range(1, 6):
        store.save_partial("c1", partial_after(user, "word " * n))
    assert sidecar.read_bytes().count(b"\n") == 5
    loaded = open_store(url).load("c1").partial
    assert loaded is not None
    assert loaded.content == "word " * 5


@pytest.mark.invariant(4)
def test_a_torn_last_line_is_ignored_and_the_next_flush_rewrites_the_file(
        tmp_path: Path) -> None:
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)
    store.save_partial("c1", partial_after(user, "one"))
    store.save_partial("c1", partial_after(user, "one two"))
    with open(sidecar, "ab") as fh:  # a killed append: part of a record, no newline
        fh.write(b'{"schema":1,"conversation":"c1","mess')
    other = open_store(url)
    loaded = other.load("c1").partial
    assert loaded is not None
    assert loaded.content == "one two"
    # this process cannot vouch for the tail: it rewrites instead of appending to it
    other.save_partial("c1", partial_after(user, "one two three"))
    assert sidecar.read_bytes().count(b"\n") == 1
    # and the first store, whose view of the file is stale, does not append either
    store.save_partial("c1", partial_after(user, "one two three four"))
    assert sidecar.read_bytes().count(b"\n") == 1
    loaded = open_store(url).load("c1").partial
    assert loaded is not None
    assert loaded.content == "one two three four"


def test_the_log_is_rewritten_when_it_grows_past_its_limit(tmp_path: Path) -> None:
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)
    text = ""
    for _ in range(200):
        text += "x" * 100
        store.save_partial("c1", partial_after(user, text))
    assert sidecar.stat().st_size <= 256 * 1024
    loaded = open_store(url).load("c1").partial
    assert loaded is not None
    assert loaded.content == text


FLUSHES = 20
SCRIPT = f"""
import os, sys
from chatstate.errors import ConflictError
from chatstate.stores import open_store
from chatstate.core.transcript import Message
store = open_store(sys.argv[1])
user = store.load("c1").messages[-1]
seal = lambda text: Message.seal(user, role="assistant", content=text, turn_id="t1",
                                 status="partial")
store.save_partial("c1", seal("first"))
os.getppid()
for n in range({FLUSHES}):
    store.save_partial("c1", seal("word " * (n + 2)))
os.getppid()
"""


def test_a_flush_costs_one_fsync(tmp_path: Path) -> None:
    require_tool("strace")
    url, _user, _sidecar = setup_store(tmp_path)
    out = subprocess.run(["strace", "-f", "-e", "trace=fsync,fdatasync,getppid",
                          sys.executable, "-c", SCRIPT, url],
                         capture_output=True, text=True, timeout=120, check=True)
    trace = out.stderr
    between = trace.split("getppid()")[1] if trace.count("getppid()") >= 2 else ""
    syncs = len(re.findall(r"\b(fsync|fdatasync)\(", between))
    assert syncs == FLUSHES, trace[-2000:]


@pytest.mark.parametrize("tail", [b"", b"\n"])
def test_an_old_single_document_sidecar_still_loads(tmp_path: Path, tail: bytes) -> None:
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)
    store.save_partial("c1", partial_after(user, "from 0.1"))
    sidecar.write_bytes(sidecar.read_bytes().rstrip(b"\n") + tail)
    loaded = open_store(url).load("c1").partial
    assert loaded is not None
    assert loaded.content == "from 0.1"


@pytest.mark.parametrize("torn", [
    b'{"schema":1,"conversation":"c1","mess\n',  # the newline landed, the middle did not
    b"\0" * 40 + b"\n",  # a tail of zeros (a power cut after the size grew)
    b'{"schema":1,"conversation":"c1","message":{"role":"assis\0\0\0\0\0\0\n',
], ids=["cut", "zeros", "cut-then-zeros"])
def test_a_torn_last_record_falls_back_to_the_last_whole_one(tmp_path: Path,
                                                              torn: bytes) -> None:
    """A torn append that still ends in a newline (a filesystem tears an unsynced write)
    was never acknowledged: the record before it is the partial reply, and reading does
    not rewrite the file."""
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)
    store.save_partial("c1", partial_after(user, "one"))
    store.save_partial("c1", partial_after(user, "one two"))
    with open(sidecar, "ab") as fh:
        fh.write(torn)
    before = sidecar.read_bytes()
    loaded = open_store(url).load("c1")
    assert [m.content for m in loaded.messages] == ["hi"]
    assert loaded.partial is not None
    assert loaded.partial.content == "one two"
    assert sidecar.read_bytes() == before


_DELETE_CUT = r'''
import os, sys
import chatstate.stores.json.store as js
real = js.remove_durably
def cut(path):
    removed = real(path)
    os._exit(137)  # killed after the first file of delete() went, before the second
js.remove_durably = cut
from chatstate.errors import ConflictError
from chatstate.stores import open_store
open_store(sys.argv[1]).delete("c1")
'''


@pytest.mark.invariant(7)
def test_a_delete_cut_short_leaves_no_partial_a_new_conversation_takes_for_its_own(
        tmp_path: Path) -> None:
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)  # open before the delete, as a long-running serve would be
    store.save_partial("c1", partial_after(user, "the OLD conversation's reply"))
    cut = subprocess.run([sys.executable, "-c", _DELETE_CUT, url], cwd=Path(__file__).parent,
                         capture_output=True, text=True)
    assert cut.returncode == 137, cut.stderr
    assert not sidecar.exists()  # the partial goes first: the transcript is what is left
    with pytest.raises(ConflictError):  # still there: a rerun of delete finishes it
        store.create(Conversation(id="c1"))
    store.delete("c1")
    store.create(Conversation(id="c1"))
    store.append("c1", [Message.seal(None, role="user", content="a new one", turn_id="t2")])
    for reader in (store, open_store(url)):
        assert reader.load("c1").partial is None
        assert not any("c1" in r for r in reader.recovery)


def test_a_partial_left_without_its_transcript_is_not_adopted_by_a_new_conversation(
        tmp_path: Path) -> None:
    url, user, sidecar = setup_store(tmp_path)
    store = open_store(url)
    store.save_partial("c1", partial_after(user, "the OLD conversation's reply"))
    left = sidecar.read_bytes()
    store.delete("c1")
    sidecar.write_bytes(left)  # what a delete of an older version, cut short, left behind
    store.create(Conversation(id="c1"))
    store.append("c1", [Message.seal(None, role="user", content="a new one", turn_id="t2")])
    assert store.load("c1").partial is None
    assert open_store(url).load("c1").partial is None
