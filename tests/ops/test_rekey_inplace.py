"""``chatstate rekey`` in place (issue 25, point 5): a real process killed with SIGKILL at
random points and rerun; after every kill the store opens with the old key and with the
new one, nothing acknowledged is lost, appends go under the new key; at the end every
record is sealed by the new key, every conversation verifies with it, the old key is
refused."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import CHATSTATE, cli_env
from support.s3server import moto_endpoint, new_bucket_url
from support.sealed import KEY, OTHER_KEY, keyless, open_raw
from support.seaweed import seaweed_endpoint, seaweed_server, seaweed_url

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConfigurationError, ConflictError
from chatstate.stores import open_store
from chatstate.stores.codec import fingerprint_of, parse_key
from chatstate.stores.rekey import record_keys
from chatstate.testing.store_contract import seal_chain

# the fixtures, re-exported so pytest finds them here
__all__ = ["moto_endpoint", "seaweed_endpoint", "seaweed_server"]

OLD, NEW = parse_key(KEY, "test"), parse_key(OTHER_KEY, "test")
SECRET = "rekey-secret-51c2"


KINDS = ["json", "sqlite", "postgres", "s3"]


def _url(tmp_path: Path, kind: str, request: pytest.FixtureRequest | None = None) -> str:
    """A fresh store of ``kind`` (postgres: a fresh schema on the session's server; s3: a
    fresh bucket on the moto server, seaweed: a fresh prefix on the SeaweedFS one)."""
    if kind == "postgres":
        from support.pgserver import fresh_schema_url

        assert request is not None
        return fresh_schema_url(request.getfixturevalue("pg_dsn"))
    if kind == "s3":
        assert request is not None
        return new_bucket_url(request.getfixturevalue("moto_endpoint"))
    if kind == "seaweed":
        assert request is not None
        return seaweed_url(request.getfixturevalue("seaweed_endpoint"))
    return f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"


def _fill(url: str, conversations: int = 10, messages: int = 120) -> None:
    with keyless():
        store = open_store(url, key=OLD)
        for i in range(conversations):
            cid = f"c{i:02d}"
            store.create(Conversation(id=cid, title=f"t{i} {SECRET}",
                                      metadata={"summary": f"s{i} {SECRET}"}))
            msgs = seal_chain(messages, prefix=f"m{i} {SECRET}")
            store.append(cid, msgs)
            if i % 3 == 0:
                store.save_partial(cid, Message.seal(msgs[-1], role="assistant",
                                                     status="partial", turn_id="t-p",
                                                     content=f"half {i} {SECRET}"))
        store.close()


def _every(url: str, key: bytes, old_keys: tuple[bytes, ...],
           view: Callable[[Any, Conversation], Any]) -> dict[str, Any]:
    """``view(store, conversation)`` of every conversation, from a fresh keyed open."""
    with keyless():
        store = open_store(url, key=key, old_keys=old_keys)
        try:
            return {s.id: view(store, store.load(s.id)) for s in store.list_conversations()}
        finally:
            store.close()


def _content(url: str, key: bytes, old_keys: tuple[bytes, ...] = ()) -> dict[str, Any]:
    """Every conversation as the caller sees it (hashes included)."""
    return _every(url, key, old_keys, lambda _, conv: (
        conv.title, conv.metadata, [(m.seq, m.role, m.content, m.hash) for m in conv.messages],
        None if conv.partial is None else conv.partial.content))


def _fingerprints(url: str) -> dict[str, dict[str, str | None]]:
    raw = open_raw(url)
    try:
        return {s.id: record_keys(raw.load(s.id)) for s in raw.list_conversations()
                if s.id != "chatstate.encryption"}
    finally:
        raw.close()


REKEY = [CHATSTATE, "rekey", "--new-key-env", "REKEY_NEW"]


def _env(root: Path, url: str) -> dict[str, str]:
    """The rekey's environment: the old key configured, the new one in REKEY_NEW."""
    return cli_env(root, CHATSTATE_STORE=url, CHATSTATE_ENCRYPTION_KEY=KEY,
                   REKEY_NEW=OTHER_KEY)


def _rekey(root: Path, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(REKEY, env=_env(root, url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _kill_at_random(proc: subprocess.Popen[str], rng: random.Random, lines: int) -> bool:
    """SIGKILL ``proc`` after a random number of its progress lines and a random pause;
    False when it had finished first."""
    assert proc.stderr is not None
    wanted = rng.randrange(0, lines)
    seen = 0
    while seen < wanted:
        line = proc.stderr.readline()
        if not line:
            break
        seen += "re-encrypted" in line
    time.sleep(rng.random() * 0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def _append_one(url: str, key: bytes, cid: str, text: str) -> None:
    with keyless():
        store = open_store(url, key=key)
        try:
            last = store.load(cid).messages[-1]
            store.append(cid, [Message.seal(last, role="user", content=text,
                                            turn_id=f"t-{text}")])
        finally:
            store.close()


Reading = Callable[..., dict[str, Any]]
"""``read(url, key, old_keys=())``: every conversation as a caller sees it."""


def _kill_trials(tmp_path: Path, kind: str, request: pytest.FixtureRequest, *,
                 fill: Callable[[str], None], read: Reading, kills: int, lines: int,
                 after_kill: Callable[[str, random.Random, int], None] | None = None,
                 finished: Callable[[Path, str, dict[str, Any]], None]) -> None:
    """Three trials on fresh stores: ``fill``, then up to ``kills`` rekeys SIGKILLed after a
    random number (below ``lines``) of their progress lines, each followed by the checks
    that either key reads everything as acknowledged and by ``after_kill`` (which may
    append: what is expected is read again after it); then one rekey run to the end and
    ``finished``. At least three kills must strike a running rekey."""
    seed = int.from_bytes(os.urandom(4), "big")  # named in every failure, to replay it
    rng = random.Random(seed)
    killed = 0
    for trial in range(3):
        root = tmp_path / f"trial{trial}"
        root.mkdir()
        url = _url(root, kind, request)
        fill(url)
        expected = read(url, OLD)
        for kill in range(kills):
            if not _kill_at_random(_rekey(root, url), rng, lines=lines) or _finished(url):
                # it finished before the kill, or the kill came after its last write (the
                # mark names the new key alone, the old one is refused): checked below
                break
            killed += 1
            # either key opens it, and every record reads back as it was acknowledged
            assert read(url, OLD) == expected, (seed, trial, kill)
            assert read(url, NEW, (OLD,)) == expected, (seed, trial, kill)
            if after_kill is not None:
                after_kill(url, rng, kill)
                expected = read(url, OLD)
        done = subprocess.run([*REKEY, "--json"], env=_env(root, url), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (seed, trial, done.stderr)
        assert KEY not in done.stdout + done.stderr and OTHER_KEY not in done.stdout + done.stderr
        finished(root, url, expected)
    assert killed >= 3, f"only {killed} of {3 * kills} kills struck a running rekey (seed {seed})"


def _finished(url: str) -> bool:
    """Does the store's mark name the new key alone (the rotation over)?"""
    mark = _mark(url)
    return mark["key"] == fingerprint_of(NEW) and "rekey" not in mark


def _append_after_kill(url: str, rng: random.Random, kill: int) -> None:
    """After a kill: once the rotation started, the new key alone opens the store too and
    doctor says a rekey runs; an append (configured with the old key) is acknowledged and,
    once the rotation started, sealed by the new key."""
    expected = _content(url, OLD)
    rotating = bool(_mark(url).get("rekey"))
    if rotating:
        assert _content(url, NEW) == expected, kill
        assert "a rekey from key" in _doctor_note(url)
    cid = f"c{rng.randrange(10):02d}"
    _append_one(url, OLD, cid, f"after kill {kill} {SECRET}")
    fps = _fingerprints(url)[cid]
    last = max(int(k.split()[1]) for k in fps if k.startswith("message "))
    if rotating:
        assert fps[f"message {last}"] == fingerprint_of(NEW), fps


@pytest.mark.parametrize("kind", [*KINDS, "seaweed"])
def test_rekey_in_place_killed_at_random_points_loses_nothing(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    _kill_trials(tmp_path, kind, request, fill=_fill, read=_content, kills=2, lines=10,
                 after_kill=_append_after_kill, finished=_assert_finished)


def _doctor_note(url: str) -> str:
    from chatstate.stores.sealed import encryption_note

    raw = open_raw(url)
    try:
        return encryption_note(raw) or ""
    finally:
        raw.close()


def _mark(url: str) -> dict[str, Any]:
    from chatstate.stores.sealed import marker

    raw = open_raw(url)
    try:
        mark = marker(raw)
        assert mark is not None
        return mark
    finally:
        raw.close()


def _assert_finished(root: Path, url: str, expected: dict[str, Any]) -> None:
    new_fp = fingerprint_of(NEW)
    for cid, fps in _fingerprints(url).items():
        assert set(fps.values()) == {new_fp}, (cid, fps)
    if url.startswith("s3://"):  # nor any object a rewrite superseded, whatever the kills
        assert _objects_not_under(url, new_fp) == []
    assert _content(url, NEW) == expected
    mark = _mark(url)
    assert mark["key"] == new_fp and "rekey" not in mark
    with keyless(), pytest.raises(ConfigurationError, match="wrong encryption key"):
        open_store(url, key=OLD)
    for cid in expected:
        verify = subprocess.run([CHATSTATE, "replay", cid, "--verify"], env=cli_env(
            root, CHATSTATE_STORE=url, CHATSTATE_ENCRYPTION_KEY=OTHER_KEY),
            capture_output=True, text=True, timeout=120)
        assert verify.returncode == 0, verify.stderr
        keyless_verify = subprocess.run([CHATSTATE, "replay", cid, "--verify"], env=cli_env(
            root, CHATSTATE_STORE=url), capture_output=True, text=True, timeout=120)
        assert keyless_verify.returncode == 0 and "chain over the stored ciphertext" in \
            keyless_verify.stderr, keyless_verify.stderr


@pytest.mark.parametrize("kind", [*KINDS, "seaweed"])
def test_appends_while_rekey_runs_are_kept_and_end_under_the_new_key(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    url = _url(tmp_path, kind, request)
    _fill(url, conversations=6, messages=200)
    expected_ids = set(_content(url, OLD))
    acked: list[tuple[str, str]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        with keyless():
            store = open_store(url, key=NEW, old_keys=(OLD,))
        n = 0
        try:
            while not stop.is_set():
                cid = f"c{n % 6:02d}"
                text = f"live {n} {SECRET}"
                try:
                    last = store.load(cid).messages[-1]
                    store.append(cid, [Message.seal(last, role="user", content=text,
                                                    turn_id=f"live-{n}")])
                except ConflictError:
                    continue  # lost a race with the rekey's rewrite: not acknowledged
                acked.append((cid, text))
                n += 1
                time.sleep(0.002)  # a live writer, not a loop that never lets a rewrite land
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            store.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True,
                              text=True, timeout=300)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert done.returncode == 0, done.stderr
    assert acked, "the writer appended nothing while the rekey ran"
    content = _content(url, NEW)
    assert set(content) == expected_ids
    for cid, text in acked:
        assert any(m[2] == text for m in content[cid][2]), (cid, text)
    new_fp = fingerprint_of(NEW)
    for cid, fps in _fingerprints(url).items():
        assert set(fps.values()) == {new_fp}, (cid, fps)


def test_rekey_without_a_new_key_or_twice(tmp_path: Path) -> None:
    url = _url(tmp_path, "sqlite")
    _fill(url, conversations=2, messages=5)
    env = _env(tmp_path, url)
    bare = subprocess.run([CHATSTATE, "rekey"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert bare.returncode != 0 and "--new-key-file" in bare.stderr
    first = subprocess.run(REKEY, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "re-encrypted" in first.stdout and "is now refused" in first.stdout, first.stdout
    again = subprocess.run(REKEY, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout
    with keyless(), pytest.raises(ConfigurationError, match="wrong encryption key"):
        open_store(url, key=OLD)


PNG = b"\x89PNG\r\n\x1a\n" + b"pixels " * 30_000
PDF = b"%PDF-1.4 " + b"page " * 40_000


def _add_blobs(url: str) -> None:
    """Images and a file in three conversations (one image shared by two), with text
    after them, so the re-addressed messages are not the last ones."""
    from chatstate.core.content import file, image, store_parts, text

    with keyless():
        store = open_store(url, key=OLD)
        try:
            for cid, parts in (("c00", [text(f"see {SECRET}"), image(PNG, name="a.png")]),
                               ("c01", [image(PNG, name="same.png"), file(PDF, name="d.pdf")]),
                               ("c02", [text("a file"), file(PDF + b"2", name="e.pdf")])):
                last = store.load(cid).messages[-1]
                msg = Message.seal(last, role="user", content=store_parts(store, parts),
                                   turn_id=f"t-img-{cid}")
                after = Message.seal(msg, role="assistant", content=f"nice {SECRET}",
                                     turn_id=f"t-img-{cid}")
                store.append(cid, [msg, after])
        finally:
            store.close()


def _with_bytes(url: str, key: bytes, old_keys: tuple[bytes, ...] = ()) -> dict[str, Any]:
    """Every conversation as the caller sees it, each blob reference replaced by the bytes
    it names (its address is a keyed digest: it changes with the key); chains verified."""
    def view(store: Any, conv: Conversation) -> Any:
        assert conv.verify() is None, conv.id
        msgs = []
        for m in conv.messages:
            content = m.content if isinstance(m.content, str) else [
                {**p, "blob": {**{k: v for k, v in p["blob"].items() if k != "sha256"},
                               "bytes": store.get_blob(p["blob"]["sha256"])}}
                if isinstance(p.get("blob"), dict) else p for p in m.content]
            msgs.append((m.seq, m.role, m.turn_id, content))
        return (conv.title, conv.metadata, msgs,
                None if conv.partial is None else conv.partial.content)

    return _every(url, key, old_keys, view)


def _blob_keys(url: str) -> dict[str, str | None]:
    """The key (fingerprint) of every blob the stored records name."""
    from chatstate.stores.codec import BLOB_MAGIC
    from chatstate.stores.rekey import stored_blobs

    raw = open_raw(url)
    try:
        named = {sha for s in raw.list_conversations() if s.id != "chatstate.encryption"
                 for sha in stored_blobs(raw.load(s.id))}
        return {sha: raw.get_blob(sha)[len(BLOB_MAGIC):len(BLOB_MAGIC) + 8].hex()
                for sha in named}
    finally:
        raw.close()


def _fill_with_blobs(url: str) -> None:
    _fill(url, conversations=6, messages=40)
    _add_blobs(url)
    assert set(_blob_keys(url).values()) == {fingerprint_of(OLD)}


def _assert_blobs_finished(root: Path, url: str, expected: dict[str, Any]) -> None:
    keys = _blob_keys(url)
    assert set(keys.values()) == {fingerprint_of(NEW)}, keys  # every blob named by its new
    # address (the old ones are left to gc)
    assert _with_bytes(url, NEW) == expected
    for cid, fps in _fingerprints(url).items():
        assert set(fps.values()) == {fingerprint_of(NEW)}, (cid, fps)
    if url.startswith("s3://"):  # nor any object a rewrite superseded, whatever the kills
        assert _objects_not_under(url, fingerprint_of(NEW)) == []
    with keyless(), pytest.raises(ConfigurationError, match="wrong encryption key"):
        open_store(url, key=OLD)
    verify = subprocess.run([CHATSTATE, "replay", "c01", "--verify"], env=cli_env(
        root, CHATSTATE_STORE=url, CHATSTATE_ENCRYPTION_KEY=OTHER_KEY),
        capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_rekey_in_place_with_blobs_killed_at_random_points_loses_nothing(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    # kills after 0 or 1 of its 6 conversations: three kills leave work for the next
    # (with up to 7, a loaded machine's rekey often finished first: 2 of 9 struck)
    _kill_trials(tmp_path, kind, request, fill=_fill_with_blobs, read=_with_bytes, kills=3,
                 lines=2, finished=_assert_blobs_finished)


def test_rekey_leaves_the_old_blobs_to_gc(tmp_path: Path) -> None:
    url = _url(tmp_path, "sqlite")
    _fill(url, conversations=3, messages=3)
    _add_blobs(url)
    old_blobs = set(_blob_keys(url))
    done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "3 blob(s)" in done.stdout and "chatstate gc" in \
        done.stdout, done.stdout
    raw = open_raw(url)
    try:
        held = {sha for sha, _size, _age in raw.list_blobs()}
    finally:
        raw.close()
    assert old_blobs <= held and len(held) == 6  # the old copies stay until gc
    gc = subprocess.run([CHATSTATE, "gc", "--grace", "0s", "--force", "--yes"], env=cli_env(
        tmp_path, CHATSTATE_STORE=url, CHATSTATE_ENCRYPTION_KEY=OTHER_KEY),
        capture_output=True, text=True, timeout=120)
    assert gc.returncode == 0, gc.stderr
    raw = open_raw(url)
    try:
        assert {sha for sha, _s, _a in raw.list_blobs()} == set(_blob_keys(url))
    finally:
        raw.close()


def test_rekey_waits_for_an_interrupted_turn_in_a_conversation_with_blobs(
        tmp_path: Path) -> None:
    url = _url(tmp_path, "sqlite")
    _fill(url, conversations=3, messages=3)
    _add_blobs(url)
    with keyless():  # an interrupted reply after c01's image and file
        store = open_store(url, key=OLD)
        last = store.load("c01").messages[-1]
        store.save_partial("c01", Message.seal(last, role="assistant", status="partial",
                                               turn_id="t-cut", content=f"half {SECRET}"))
        store.close()
    expected = _with_bytes(url, OLD)
    done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "'c01'" in done.stderr and "interrupted" in done.stderr, \
        done.stderr
    assert _with_bytes(url, OLD) == expected == _with_bytes(url, NEW)  # both keys read
    assert set(_fingerprints(url)["c02"].values()) == {fingerprint_of(NEW)}  # the rest done
    with keyless():
        store = open_store(url, key=NEW)
        store.clear_partial("c01")  # the turn is over (retried, or given up)
        store.close()
    again = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert set(_blob_keys(url).values()) == {fingerprint_of(NEW)}
    with keyless(), pytest.raises(ConfigurationError, match="wrong encryption key"):
        open_store(url, key=OLD)


def _objects_not_under(url: str, fp: str) -> list[str]:
    """The s3 store's segments and snapshots holding a record not sealed by the key of
    fingerprint ``fp``."""
    import base64
    import json

    from support.s3server import object_keys, read_object

    from chatstate.stores.codec import FP_BYTES

    out = []
    for name in object_keys(url):
        if "/m/" not in name and "/snap/" not in name:
            continue
        data = read_object(url, name)
        assert data is not None, name
        for msg in json.loads(data)["messages"]:
            sealed = base64.b64decode(msg["content"][0]["data"])
            if sealed[:FP_BYTES].hex() != fp:
                out.append(name)
                break
    return out


@pytest.mark.parametrize("kind", ["s3", "seaweed"])
def test_rekey_in_place_re_keys_an_s3_store(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """s3 (moto and SeaweedFS) is re-keyed in place like the others (it used to be refused:
    "cannot rewrite a conversation in place"), messages, partial replies, titles,
    metadata and blobs; a writer whose copy of a conversation predates the rewrite
    appends onto the rewritten chain (its first try conflicts, it seals again)."""
    url = _url(tmp_path, kind, request)
    _fill(url, conversations=5, messages=70)  # past a snapshot (every 64 messages)
    _add_blobs(url)
    new_fp = fingerprint_of(NEW)
    assert len(_objects_not_under(url, new_fp)) == 5 * 2 + 3  # a segment and a snapshot
    # each, and the blob turns' segments
    with keyless():  # a writer of both keys, its copy of c04's chain the old one (c04 names
        # no blob, so its plaintext hashes stay; nor has it a partial reply)
        stale = open_store(url, key=NEW, old_keys=(OLD,))
    try:
        last = stale.load("c04").messages[-1]
        expected = _with_bytes(url, OLD)
        done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "re-encrypted" in done.stdout and "is now refused" in done.stdout, done.stdout
        _assert_blobs_finished(tmp_path, url, expected)
        # the objects the rewrites superseded (the old key's records) are gone
        assert _objects_not_under(url, new_fp) == []
        # its append onto the rewritten chain conflicts, and it seals again from it
        stale.append("c04", [Message.seal(last, role="user", content=f"after {SECRET}",
                                          turn_id="t-after")])
    finally:
        stale.close()
    conv = _content(url, NEW)["c04"]
    assert conv[2][-1][2] == f"after {SECRET}" and len(conv[2]) == len(expected["c04"][2]) + 1
    assert set(_fingerprints(url)["c04"].values()) == {fingerprint_of(NEW)}
    raw = open_raw(url)
    try:
        counts = {s.id: s.message_count for s in raw.list_conversations()}
        assert raw.leftovers(sorted(counts), counts) == []  # (superseded ones too)
    finally:
        raw.close()


def test_a_rerun_removes_what_a_kill_left_after_an_s3_rewrite(
        tmp_path: Path, moto_endpoint: str) -> None:
    """A rekey killed after a conversation's rewrite segment was stored but before the
    objects it superseded were removed (the old key's records) leaves them: the rerun,
    holding the conversation, removes them (they used to stay in the bucket for good)."""
    from support.s3server import object_keys, read_object, write_object

    from chatstate.stores._mark import MARKER_ID
    from chatstate.stores.rekey import rotation_mark

    url = new_bucket_url(moto_endpoint)
    _fill(url, conversations=2, messages=70)
    old = {k: read_object(url, k) for k in object_keys(url)
           if k.startswith("conversations/c00/") and ("/m/" in k or "/snap/" in k)}
    expected = _content(url, OLD)
    done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    new_fp = fingerprint_of(NEW)
    assert _objects_not_under(url, new_fp) == []
    # the state of a kill in c00's rewrite, between its segment and the removal: the
    # superseded objects back, the mark saying the rotation runs
    for key, data in old.items():
        assert data is not None
        write_object(url, key, data)
    raw = open_raw(url)
    try:
        raw.set_header(MARKER_ID, metadata={"encryption": rotation_mark(OLD, NEW)})
    finally:
        raw.close()
    assert sorted(_objects_not_under(url, new_fp)) == sorted(old)
    assert _content(url, NEW) == expected  # never read as the chain
    again = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    assert _objects_not_under(url, new_fp) == []
    _assert_finished(tmp_path, url, expected)


@pytest.mark.parametrize("kind", ["json", "sqlite", "s3"])
def test_rekey_waits_for_a_turn_holding_the_lease_and_stops_resumable(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    url = _url(tmp_path, kind, request)
    _fill(url, conversations=3, messages=4)
    expected = _content(url, OLD)
    holder = open_raw(url)
    lease = holder.acquire_lease("c01", term=300)
    try:
        busy = subprocess.run([*REKEY, "--wait", "0.5"], env=_env(tmp_path, url),
                              capture_output=True, text=True, timeout=120)
        assert busy.returncode != 0 and "c01" in busy.stderr and "run rekey again" in \
            busy.stderr, busy.stderr
        assert set(_fingerprints(url)["c01"].values()) == {fingerprint_of(OLD)}  # untouched
        assert _content(url, OLD) == expected == _content(url, NEW)  # both keys still read
    finally:
        holder.release_lease(lease)
        holder.close()
    done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    _assert_finished(tmp_path, url, expected)


def test_rekey_in_place_refuses_a_plain_store(tmp_path: Path) -> None:
    url = _url(tmp_path, "sqlite")
    with keyless():
        store = open_store(url)
        store.create(Conversation(id="plain"))
        store.close()
    done = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "not encrypted" in done.stderr, done.stderr
    raw = open_raw(url)
    try:
        assert [s.id for s in raw.list_conversations()] == ["plain"]  # not marked either
    finally:
        raw.close()


@pytest.mark.parametrize("kind", ["json", "sqlite", "s3"])
def test_a_conversation_an_old_writer_creates_after_the_rotation_is_re_keyed_by_a_rerun(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """A writer that opened the store with only the old key before the rotation, and
    creates a conversation after rekey's last pass, leaves it sealed by the old key: the
    same rekey command run again finds it and re-keys it (it used to say "nothing to do"
    and leave it unreadable with the new key)."""
    url = _url(tmp_path, kind, request)
    _fill(url, conversations=2, messages=3)
    with keyless():
        old_writer = open_store(url, key=OLD)  # opened before the rotation, kept open
    try:
        first = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True,
                               text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        old_writer.create(Conversation(id="late", title=f"late {SECRET}"))
        old_writer.append("late", seal_chain(3, prefix=f"late {SECRET}"))
    finally:
        old_writer.close()
    assert set(_fingerprints(url)["late"].values()) == {fingerprint_of(OLD)}
    expected = _content(url, NEW, (OLD,))
    again = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "nothing to do" not in again.stdout, again.stdout
    assert "re-encrypted" in again.stdout, again.stdout
    _assert_finished(tmp_path, url, expected)
    once_more = subprocess.run(REKEY, env=_env(tmp_path, url), capture_output=True,
                               text=True, timeout=120)
    assert once_more.returncode == 0 and "nothing to do" in once_more.stdout, once_more.stdout
