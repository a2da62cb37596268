"""The writer lease, on every store (the contract suite's ``store_url``).

One live writer per conversation: a second writer gets ConversationInUse naming
host and pid, or waits; a renewed lease never lapses; a killed writer's lease is
taken over (at once on its own host, after its term from elsewhere).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import SUPPORT

from chatstate import ChatstateError, ConflictError, ConversationInUse
from chatstate.stores import Leases, open_store

HOLDER = SUPPORT / "lease_holder.py"


def test_every_builtin_store_has_leases(store_url: str) -> None:
    store = open_store(store_url)
    assert isinstance(store, Leases)


@pytest.mark.parametrize("damage", [b"{not json", b"[1, 2]", b"\0" * 64])
def test_releasing_over_a_damaged_json_lease_file_is_no_error(tmp_path: Path,
                                                              damage: bytes) -> None:
    # it raised a bare JSONDecodeError (or AttributeError) from the release, which ends
    # every turn; a damaged lease is no one's, as taking one already reads it
    store = open_store(f"json://{tmp_path}/s")
    lease = store.acquire_lease("c1", term=30)
    path = tmp_path / "s" / ".locks" / "c1.lease"
    path.write_bytes(damage)
    store.release_lease(lease)
    assert path.read_bytes() == damage  # not ours to remove
    store.release_lease(store.acquire_lease("c1"))  # and taken again at once


@pytest.mark.invariant(5)
def test_second_writer_gets_a_clear_error(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    lease = first.acquire_lease("c1", term=30)
    with pytest.raises(ConversationInUse) as info:
        second.acquire_lease("c1")
    message = str(info.value)
    assert f"in use by host {socket.gethostname()}, pid {os.getpid()}" in message
    assert "'c1'" in message
    assert isinstance(info.value, ConflictError)
    assert info.value.pid == os.getpid()
    assert info.value.host == socket.gethostname()
    other = second.acquire_lease("c2")  # leases are per conversation
    first.release_lease(lease)
    second.release_lease(second.acquire_lease("c1"))
    second.release_lease(other)


def test_second_writer_waits_for_the_release(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    lease = first.acquire_lease("c1", term=30)
    got = threading.Event()

    def wait() -> None:
        second.acquire_lease("c1", wait=60)
        got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not got.wait(0.5)
    first.release_lease(lease)
    thread.join(60)
    assert got.is_set()


def test_a_renewed_lease_outlives_its_term(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    lease = first.acquire_lease("c1", term=1.0)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        first.renew_lease(lease)
        with pytest.raises(ConversationInUse):
            second.acquire_lease("c1")
        time.sleep(0.2)
    first.release_lease(lease)


@pytest.mark.invariant(5)
def test_a_lapsed_lease_is_taken_over_and_its_holder_told(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    lease = first.acquire_lease("c1", term=0.5)
    time.sleep(1.0)
    taken = second.acquire_lease("c1", term=30)
    with pytest.raises(ConversationInUse):
        first.renew_lease(lease)
    first.release_lease(lease)  # no longer ours: a no-op
    with pytest.raises(ConversationInUse):
        first.acquire_lease("c1")
    second.release_lease(taken)


def _holder(store_url: str, term: float, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(HOLDER), store_url, "c1", str(term), *args],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("held "), line
    return proc


@pytest.mark.invariant(7)
def test_killed_writer_lease_is_taken_over_at_once_on_its_host(store_url: str) -> None:
    proc = _holder(store_url, 300)
    store = open_store(store_url)
    with pytest.raises(ConversationInUse) as info:
        store.acquire_lease("c1")
    assert f"pid {proc.pid}" in str(info.value)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    store.release_lease(store.acquire_lease("c1"))  # its pid is gone: known dead


def test_killed_writer_on_another_host_lapses_after_its_term(store_url: str) -> None:
    proc = _holder(store_url, 2.0, "another-host")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    store = open_store(store_url)
    with pytest.raises(ConversationInUse) as info:
        store.acquire_lease("c1")
    assert "host another-host" in str(info.value)
    started = time.monotonic()
    store.release_lease(store.acquire_lease("c1", wait=30))
    assert time.monotonic() - started < 30


@pytest.mark.invariant(5)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
@pytest.mark.parametrize(("holder_skew", "taker_skew", "host"), [
    (120.0, 0.0, ()), (0.0, 120.0, ("another-host",))],
    ids=["holder-ahead-same-host", "taker-ahead-other-host"])
def test_a_clock_step_does_not_expire_a_live_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, holder_skew: float,
        taker_skew: float, host: tuple[str, ...]) -> None:
    """Expiry is judged by renewals, never by comparing two writers' wall clocks: with
    either writer's clock 120 s ahead, a live (renewing) holder in another process keeps
    its lease, and the "in use" message tells its age by one clock; once the holder stops
    renewing (SIGSTOP: alive, silent) the lease is taken after one term, not 120 s late."""
    from chatstate.stores import leases

    term = 3.0  # renewed every second: slack for a loaded machine
    url = f"json://{tmp_path}/j" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    open_store(url).close()
    proc = _holder(url, term, *host, "--skew", str(holder_skew), "--renew")
    monkeypatch.setattr(leases, "wall_clock", lambda: time.time() + taker_skew)
    store = open_store(url)
    try:
        with pytest.raises(ConversationInUse) as info:
            store.acquire_lease("c1", wait=1.5 * term)
        message = str(info.value)
        assert f"pid {proc.pid}" in message
        renewed = re.search(r"renewed ([0-9.]+) s ago", message)
        assert renewed is not None, message
        assert float(renewed.group(1)) <= term, message
        proc.send_signal(signal.SIGSTOP)
        with pytest.raises(ConversationInUse):
            store.acquire_lease("c1")  # stopped just now: still within its term
        store.release_lease(store.acquire_lease("c1", wait=3 * term))
    finally:
        proc.kill()
        proc.wait(30)
        store.close()


def _live_writer_of(store: Any, cid: str, partial: str) -> tuple[Any, Any]:
    """``cid`` as a live writer leaves it mid-reply: a user message, its partial reply so
    far, and the writer's lease held (by this process). Returns (user message, lease)."""
    from chatstate.core.transcript import Conversation, Message

    store.create(Conversation(id=cid))
    user = Message.seal(None, role="user", content="first", turn_id="t1")
    store.append(cid, [user])
    store.save_partial(cid, Message.seal(user, role="assistant", content=partial,
                                         turn_id="t1", status="partial"))
    return user, store.acquire_lease(cid, wait=0)


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_the_cli_says_nothing_was_stored_when_another_writer_holds_it(
        tmp_path: Path, command: str) -> None:
    """`ask` and the REPL meet a conversation another live writer holds (while it streams a
    reply, its partial is in the store): the error names the holder, and neither offers
    to complete a turn, since nothing of theirs was written."""
    from support.cli_helpers import invoke

    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        _live_writer_of(store, "held", "stream")
        args = ["ask", "--offline", "--id", "held", "me too"] if command == "ask" else \
            ["chat", "--model", "fake", "--id", "held"]
        result = invoke(args, store=url, input="me too\n" if command == "chat" else None)
        said = result.out + result.err
        assert f"is in use by host {socket.gethostname()}, pid {os.getpid()}" in said
        assert "nothing was written" in said
        assert "--retry" not in said, said
        assert "/retry" not in said, said
        if command == "ask":
            assert result.code == 1
        else:
            assert "[nothing was stored or sent; send it again once the other writer " \
                   "is done]" in said
        stored = store.load("held")
        assert [m.content for m in stored.messages] == ["first"]
        assert stored.partial is not None
        assert stored.partial.content == "stream"  # untouched
    finally:
        store.close()


def test_the_repl_sees_a_turn_another_writer_finished_after_its_greeting(
        tmp_path: Path) -> None:
    """The greeting shows another writer's reply in progress; once that writer is done,
    the next message goes through with no stale "cut off" note about its reply."""
    from support.cli_helpers import CHATSTATE, cli_env

    from chatstate.core.transcript import Message

    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        user, lease = _live_writer_of(store, "held", "stre")
        repl = subprocess.Popen([CHATSTATE, "--store", url, "chat", "--model", "fake", "--id",
                                 "held"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cli_env(tmp_path))
        assert repl.stderr is not None
        assert repl.stdin is not None
        greeting = []
        for line in repl.stderr:
            greeting.append(line)
            if "partial reply so far" in line:
                break
        assert any("another writer is replying in this conversation now" in g
                   for g in greeting), greeting
        # the other writer finishes its turn and lets go
        store.append("held", [Message.seal(user, role="assistant", content="streamed whole",
                                           turn_id="t1")])
        store.release_lease(lease)
        out, err = repl.communicate("now me\n", timeout=60)
        assert repl.returncode == 0, err
        assert "cut off" not in err, err
        assert "in use" not in err, err
        assert "assistant> Echo: now me" in out
        conv = store.load("held")
        assert [(m.role, m.content.split(" ")[0]) for m in conv.messages] == [
            ("user", "first"), ("assistant", "streamed"), ("user", "now"),
            ("assistant", "Echo:")]
    finally:
        store.close()


def test_a_store_that_cannot_be_written_cannot_say_who_holds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looking for a live writer takes and gives back the lease, a write: on a full disk
    that look answers "cannot tell" (None) instead of failing the REPL's greeting, and
    what the next turn meets says why."""
    import errno

    from chatstate.core.transcript import Conversation
    from chatstate.session.writer_lease import held_elsewhere

    store = open_store(f"json://{tmp_path}/j")
    try:
        store.create(Conversation(id="c"))
        real_open = os.open

        def full(path: Any, flags: int, *args: Any) -> int:
            if str(path).endswith(".lease") or ".lease." in str(path):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", full)
        assert held_elsewhere(store, "c") is None
        with pytest.raises(ChatstateError, match="No space left"):
            store.acquire_lease("c", wait=0)
        monkeypatch.undo()
        other = store.acquire_lease("c", wait=0)  # a live holder is still seen
        found = held_elsewhere(store, "c")
        assert found is not None
        assert found.pid == os.getpid()
        store.release_lease(other)
    finally:
        store.close()


def test_ask_lease_wait_waits_for_the_other_writer(tmp_path: Path) -> None:
    """`ask --lease-wait` waits while another writer holds the conversation, then its turn
    goes on after that writer's (here: left partial, so kept in the chain as partial)."""
    from support.cli_helpers import invoke

    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        _, lease = _live_writer_of(store, "held", "stream")
        released: list[float] = []

        def let_go() -> None:
            time.sleep(1.0)
            released.append(time.monotonic())
            store.release_lease(lease)

        holder = threading.Thread(target=let_go)
        holder.start()
        result = invoke(["ask", "--offline", "--id", "held", "--lease-wait", "30", "me too"],
                        store=url)
        answered = time.monotonic()
        holder.join()
        assert result.code == 0, result.err
        assert "Echo: me too" in result.out
        assert released
        assert answered >= released[0]
        conv = store.load("held")
        assert [(m.role, m.status, m.content.split(" ")[0]) for m in conv.messages] == [
            ("user", "complete", "first"), ("assistant", "partial", "stream"),
            ("user", "complete", "me"), ("assistant", "complete", "Echo:")]
        assert conv.verify() is None
    finally:
        store.close()
