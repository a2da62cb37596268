"""Encryption at rest (issue 25): what an encrypted store holds, how it refuses, and what
it checks with and without its key. The contract itself runs encrypted on every store in
test_store_encrypted.py; these cases use the local stores (their bytes are files)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
from pathlib import Path

import pytest
from support.cli_helpers import invoke
from support.sealed import KEY, OTHER_KEY, flip_sealed, keyless, open_raw
from support.stores import local_path, scheme, snapshot, stored_state

from chatstate.core.canonical import chain_hash
from chatstate.core.content import image, store_parts, text
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ConfigurationError,
    CorruptTranscriptError,
    SchemaVersionError,
    Unsupported,
)
from chatstate.stores import open_store
from chatstate.stores.codec import AeadCodec, expand_row, new_key, parse_key
from chatstate.stores.keys import load_key
from chatstate.stores.sealed import SealedStore
from chatstate.testing.store_contract import seal_chain

SECRET = "my-health-question-7f3a"
PNG = b"\x89PNG\r\n\x1a\n" + b"secret-image-bytes" * 4096


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CHATSTATE_ENCRYPTION_KEY", KEY)
    return KEY


def _fill(url: str) -> tuple[list[Message], dict[str, object]]:
    """c1 with a title, metadata, three messages (one naming an image) and a partial;
    c2 with two messages. Returns c1's messages and the image's reference."""
    store = open_store(url)
    store.create(Conversation(id="c1", title=f"title {SECRET}",
                              metadata={"summary": f"summary {SECRET}"}))
    msgs = seal_chain(2, prefix=f"msg {SECRET}")
    parts = store_parts(store, [text(f"look {SECRET}"), image(PNG, name=f"{SECRET}.png")])
    msgs.append(Message.seal(msgs[-1], role="user", content=parts, turn_id="t-2"))
    store.append("c1", msgs)
    store.save_partial("c1", Message.seal(msgs[-1], role="assistant", status="partial",
                                          content=f"half {SECRET}", turn_id="t-2"))
    store.create(Conversation(id="c2"))
    store.append("c2", seal_chain(2, prefix="other"))
    ref = msgs[-1].blob_refs()[0]
    store.close()
    return msgs, ref


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_an_encrypted_store_holds_no_user_text_and_no_plaintext_digest(
        tmp_path: Path, key: str, kind: str) -> None:
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    msgs, ref = _fill(url)
    plain_digest = hashlib.sha256(PNG).hexdigest()
    assert ref["sha256"] != plain_digest
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    for path in files:
        data = path.read_bytes()
        for needle in (SECRET.encode(), plain_digest.encode(), b"secret-image-bytes",
                       KEY.encode(), key[5:].encode()):
            assert needle not in data, f"{needle[:20]!r} is stored in the clear in {path}"
    store = open_store(url)
    conv = store.load("c1")
    assert conv.messages == msgs  # hashes too: the chain over the plaintext, as before
    assert conv.title == f"title {SECRET}" and conv.metadata == {"summary": f"summary {SECRET}"}
    assert conv.partial is not None and conv.partial.content == f"half {SECRET}"
    assert isinstance(store, SealedStore)
    assert store.get_blob(str(ref["sha256"])) == PNG
    assert [s.id for s in store.list_conversations()] == ["c2", "c1"]
    store.close()


def test_a_plain_store_is_not_wrapped_and_its_hashes_are_unchanged(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    store.create(Conversation(id="c1"))
    msgs = seal_chain(3)
    store.append("c1", msgs)
    assert not isinstance(store, SealedStore)
    store.close()
    db = sqlite3.connect(local_path(url))
    rows = db.execute("SELECT body, hash FROM messages ORDER BY seq").fetchall()
    db.close()
    assert [r[0] for r in rows] == [m.body() for m in msgs]  # today's bytes
    assert [r[1] for r in rows] == [m.hash for m in msgs]


def test_missing_wrong_key_and_a_plain_store_with_a_key_each_refuse_in_one_line(
        tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    before = snapshot(local_path(url))
    with keyless(), pytest.raises(ConfigurationError) as missing:
        open_store(url)
    assert "is encrypted" in str(missing.value) and "CHATSTATE_KEY_FILE" in str(missing.value)
    monkeypatch.setenv("CHATSTATE_ENCRYPTION_KEY", OTHER_KEY)
    with pytest.raises(ConfigurationError) as wrong:
        open_store(url)
    assert "wrong encryption key" in str(wrong.value)
    for refusal in (missing.value, wrong.value):
        assert "\n" not in str(refusal)
        assert KEY not in str(refusal) and OTHER_KEY not in str(refusal)
    assert snapshot(local_path(url)) == before  # nothing overwritten
    plain = f"sqlite://{tmp_path}/plain.db"
    with keyless():
        made = open_store(plain)
        made.create(Conversation(id="c1"))
        made.close()
    with pytest.raises(ConfigurationError, match="a store created without a key stays plain"):
        open_store(plain)


def test_a_record_sealed_by_another_key_names_conversation_and_seq(
        tmp_path: Path, key: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    raw = open_raw(url)
    other = SealedStore(raw, AeadCodec(parse_key(OTHER_KEY, "test")))
    with pytest.raises(ConfigurationError) as info:
        other.load("c1")
    assert "conversation 'c1' seq 0" in str(info.value) and "sealed by key" in str(info.value)
    raw.close()


def _rechain(url: str, cid: str, bodies: dict[int, str]) -> None:
    """Replace message bodies of ``cid`` and recompute the stored chain over them, as
    someone with write access but no key can: only the tags can tell."""
    db = sqlite3.connect(local_path(url))
    with db:
        rows = db.execute("SELECT seq, body FROM messages WHERE conversation_id=? ORDER BY "
                          "seq", (cid,)).fetchall()
        prev = None
        for seq, body in rows:
            body = bodies.get(seq, _text(seq, body))
            prev = chain_hash(prev, body)
            db.execute("UPDATE messages SET body=?, hash=? WHERE conversation_id=? AND seq=?",
                       (body, prev, cid, seq))
        db.execute("UPDATE conversations SET last_hash=? WHERE id=?", (prev, cid))
    db.close()


def _body(url: str, cid: str, seq: int) -> str:
    db = sqlite3.connect(local_path(url))
    row = db.execute("SELECT body FROM messages WHERE conversation_id=? AND seq=?",
                     (cid, seq)).fetchone()
    db.close()
    return _text(seq, row[0])


def _text(seq: int, body: str | bytes) -> str:
    """A stored body as the text it stands for (a sealed record's binary row expanded)."""
    if isinstance(body, bytes):
        return (expand_row(seq, body) if body[:1] == b"\0" else body).decode()
    return body


@pytest.mark.invariant(6)
@pytest.mark.parametrize("how", ["tampered", "swapped"])
def test_a_rechained_record_fails_its_tag_naming_conversation_and_seq(
        tmp_path: Path, key: str, how: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    body = _body(url, "c1", 1)
    if how == "tampered":
        data = body.split('"data":"', 1)[1].split('"', 1)[0]
        new = body.replace(data, flip_sealed(data))
    else:  # c2's seq 1, a valid record under this key, moved into c1
        new = _body(url, "c2", 1)
    _rechain(url, "c1", {1: new})
    with keyless():  # without the key the stored chain verifies: it was rebuilt
        raw = open_raw(url)
        assert raw.load("c1").verify() is None
        raw.close()
    store = open_store(url)
    before = stored_state(url, store)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c1")
    assert "conversation 'c1' seq 1" in str(info.value)
    assert "authentication tag" in str(info.value)
    assert info.value.position == 1
    with pytest.raises(CorruptTranscriptError):
        store.append("c1", seal_chain(1, seal_chain(4)[-1]))
    assert stored_state(url, store) == before
    store.close()


def test_replay_verify_checks_the_chain_without_the_key_and_the_tags_with_it(
        tmp_path: Path, key: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    without = invoke(["replay", "c1", "--verify"], store=url,
                     env={"CHATSTATE_ENCRYPTION_KEY": None})  # type: ignore[dict-item]
    assert without.code == 0, without.err
    assert "verified without the key: 3 sealed messages" in without.err
    fingerprint = AeadCodec(parse_key(KEY, "test")).fingerprint
    assert f"sealed by key {fingerprint};" in without.err  # one key, named once
    assert SECRET not in without.out + without.err
    with_key = invoke(["replay", "c1", "--verify"], store=url,
                      env={"CHATSTATE_ENCRYPTION_KEY": KEY})
    assert with_key.code == 0, with_key.err
    assert "authentication tag checked" in with_key.err and SECRET in with_key.out
    doctor = invoke(["doctor", "--json"], store=url,
                    env={"CHATSTATE_ENCRYPTION_KEY": None})  # type: ignore[dict-item]
    assert "no key configured: the hash chains over the stored ciphertext are verified" in \
        doctor.out
    body = _body(url, "c1", 1)
    data = body.split('"data":"', 1)[1].split('"', 1)[0]
    _rechain(url, "c1", {1: body.replace(data, flip_sealed(data))})
    bad = invoke(["replay", "c1", "--verify"], store=url, env={"CHATSTATE_ENCRYPTION_KEY": KEY})
    assert bad.code == 1
    assert "conversation 'c1' seq 1" in bad.err and "authentication tag" in bad.err
    for result in (without, with_key, doctor, bad):
        assert KEY not in result.out + result.err


def test_search_is_off_on_an_encrypted_store(tmp_path: Path, key: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    store = open_store(url)
    with pytest.raises(Unsupported, match="full-text search is off"):
        store.search(SECRET)  # type: ignore[attr-defined]
    store.close()


def test_keys_come_from_the_environment_a_private_file_or_a_command(
        tmp_path: Path) -> None:
    made = new_key()
    assert len(parse_key(made, "test")) == 32
    assert load_key({}) is None
    assert load_key({"CHATSTATE_ENCRYPTION_KEY": made}) == parse_key(made, "test")
    key_file = tmp_path / "key"
    key_file.write_text(made + "\n")
    key_file.chmod(0o644)
    with pytest.raises(ConfigurationError, match="chmod 600") as loose:
        load_key({"CHATSTATE_KEY_FILE": str(key_file)})
    assert made not in str(loose.value)
    key_file.chmod(0o600)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert load_key({"CHATSTATE_KEY_FILE": str(key_file)}) == parse_key(made, "test")
    command = f"{sys.executable} -c \"print(open('{key_file}').read())\""
    assert load_key({"CHATSTATE_KEY_COMMAND": command}) == parse_key(made, "test")
    with pytest.raises(ConfigurationError, match="exited with status 3") as failed:
        load_key({"CHATSTATE_KEY_COMMAND": f"{sys.executable} -c 'print(\"{made}\"); exit(3)'"})
    assert made not in str(failed.value)
    with pytest.raises(ConfigurationError, match="not a chatstate key") as bad:
        load_key({"CHATSTATE_ENCRYPTION_KEY": "hunter2-not-a-key"})
    assert "hunter2" not in str(bad.value)


def test_keygen_prints_a_key_that_opens_a_store(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    printed = invoke(["keygen"])
    assert printed.code == 0
    made = printed.out.strip()
    assert made.startswith("csk1-") and len(parse_key(made, "keygen")) == 32
    assert invoke(["keygen"]).out.strip() != made
    monkeypatch.setenv("CHATSTATE_ENCRYPTION_KEY", made)
    store = open_store(f"json://{tmp_path}/store")
    assert isinstance(store, SealedStore)
    store.close()
    assert scheme(store.url) == "json"


def _content(url: str, key: str | None) -> list[tuple[str, str, object, list[object], object]]:
    """Every conversation as the user sees it (no hashes: blob addresses are per key)."""
    with keyless():
        store = open_store(url, key=None if key is None else parse_key(key, "test"))
    try:
        out = []
        for summary in sorted(store.list_conversations(), key=lambda s: s.id):
            conv = store.load(summary.id)
            parts = [m.text for m in conv.messages]
            blobs = [store.get_blob(str(r["sha256"])) for m in conv.messages  # type: ignore[attr-defined]
                     for r in m.blob_refs()]
            out.append((conv.id, conv.title, conv.metadata, [*parts, *blobs],
                        conv.partial.text if conv.partial else None))
        return out
    finally:
        store.close()


def test_migrate_copies_plain_to_encrypted_and_back(tmp_path: Path) -> None:
    plain = f"sqlite://{tmp_path}/plain.db"
    with keyless():
        msgs, _ = _fill(plain)
    sealed, back = f"json://{tmp_path}/sealed", f"sqlite://{tmp_path}/back.db"
    env = {"CHATSTATE_ENCRYPTION_KEY": KEY}
    to = invoke(["migrate", "--encrypt", "--from", plain, "--to", sealed], env=env)
    assert to.code == 0, to.err
    assert _content(sealed, KEY) == _content(plain, None)
    for path in (tmp_path / "sealed").rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    again = invoke(["migrate", "--encrypt", "--from", plain, "--to", sealed], env=env)
    assert again.code == 0 and "2 already identical" in again.out, again.out + again.err
    home = invoke(["migrate", "--decrypt", "--from", sealed, "--to", back], env=env)
    assert home.code == 0, home.err
    assert _content(back, None) == _content(plain, None)
    with keyless():
        restored = open_store(back)
        assert restored.load("c1").messages == msgs  # the very hashes of the original
        restored.close()


def test_rekey_killed_midway_resumes_and_loses_nothing(tmp_path: Path) -> None:
    import subprocess

    from support.cli_helpers import CHATSTATE, cli_env

    old_url, new_url = f"sqlite://{tmp_path}/old.db", f"sqlite://{tmp_path}/new.db"
    with keyless():
        store = open_store(old_url, key=parse_key(KEY, "test"))
        for i in range(12):
            store.create(Conversation(id=f"c{i:02d}", title=f"t{i} {SECRET}"))
            store.append(f"c{i:02d}", seal_chain(250, prefix=f"m{i}"))
        store.close()
    env = cli_env(tmp_path, CHATSTATE_OLD_ENCRYPTION_KEY=KEY, CHATSTATE_ENCRYPTION_KEY=OTHER_KEY)
    argv = [CHATSTATE, "rekey", "--from", old_url, "--to", new_url]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        seen += "messages" in line
        if seen == 5:  # mid-way through the third conversation
            proc.kill()
            break
    proc.wait(timeout=60)
    assert proc.returncode == -9, "the rekey finished before it could be killed"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert KEY not in done.stdout + done.stderr and OTHER_KEY not in done.stderr
    assert _content(new_url, OTHER_KEY) == _content(old_url, KEY)
    with keyless(), pytest.raises(ConfigurationError, match="wrong encryption key"):
        open_store(new_url, key=parse_key(KEY, "test"))


def test_drill_encrypted_kills_writers_of_an_encrypted_store(tmp_path: Path) -> None:
    import json
    import subprocess

    from support.cli_helpers import CHATSTATE, cli_env

    from chatstate.stores.sealed import marker

    url = f"sqlite://{tmp_path}/drill.db"
    done = subprocess.run([CHATSTATE, "drill", "--store", url, "--encrypted", "--trials", "3",
                           "--json"], env=cli_env(tmp_path, CHATSTATE_ENCRYPTION_KEY=KEY),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    raw = open_raw(url)
    try:
        mark = marker(raw)
        assert mark is not None and mark["key"] == AeadCodec(parse_key(KEY, "t")).fingerprint
    finally:
        raw.close()


def test_a_record_rolled_back_to_an_earlier_version_of_its_seq_is_caught(
        tmp_path: Path, key: str) -> None:
    """Same conversation, same seq, sealed under the key (the partial reply streamed there
    before another reply was committed): only binding the previous plaintext hash into
    the next record's tag catches it, and it does, at the next seq."""
    url = f"sqlite://{tmp_path}/s.db"
    msgs, _ = _fill(url)
    db = sqlite3.connect(local_path(url))
    old_partial = db.execute("SELECT body FROM partials WHERE conversation_id='c1'").fetchone()[0]
    db.close()
    store = open_store(url)
    reply = Message.seal(msgs[-1], role="assistant", content="the committed reply",
                         turn_id="t-2")
    store.append("c1", [reply, *seal_chain(1, reply)])
    store.close()
    partial_body = old_partial.decode() if isinstance(old_partial, bytes) else old_partial
    shell = Message.model_validate_json(partial_body)
    sealed_as_message = Message(seq=3, role="event", content=shell.content,
                                created_at=shell.created_at, turn_id="sealed",
                                status="complete").body()
    _rechain(url, "c1", {3: sealed_as_message})
    store = open_store(url)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c1")
    assert "conversation 'c1' seq 4" in str(info.value), str(info.value)
    assert "authentication tag" in str(info.value)
    store.close()


def test_gc_on_an_encrypted_store_keeps_named_blobs_and_sweeps_the_rest(
        tmp_path: Path, key: str) -> None:
    from chatstate.ops.blobgc import collect_blobs

    url = f"sqlite://{tmp_path}/s.db"
    _, ref = _fill(url)
    store = open_store(url)
    orphan = store.put_blob(b"nobody names this " * 100)  # type: ignore[attr-defined]
    sweep = collect_blobs(store, grace=0.0)
    assert sweep.removed == [orphan["sha256"]] and sweep.named == 1
    assert store.get_blob(str(ref["sha256"])) == PNG  # type: ignore[attr-defined]
    store.close()


def test_cryptography_is_imported_only_when_a_key_is_set(tmp_path: Path) -> None:
    import subprocess

    code = ("import sys; from chatstate.stores import open_store; "
            f"s = open_store('sqlite://{tmp_path}/s.db'); s.close(); "
            "print('cryptography' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATSTATE_")}
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "False"


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_store_sealed_with_gcm_siv_still_opens_and_keeps_its_algorithm(
        tmp_path: Path, key: str, kind: str) -> None:
    """Stores written before the switch to AES-256-GCM (tests/fixtures/sealed_gcm_siv,
    by commit 95377b8) open, verify and take appends sealed as before; a new store is
    sealed with AES-256-GCM, and each says so in its mark."""
    from support import TESTS

    from chatstate.stores.sealed import encryption_note, marker

    fixtures = TESTS / "fixtures" / "sealed_gcm_siv"
    shutil.copytree(fixtures / kind, tmp_path / kind)
    old = json.loads((fixtures / "hashes.json").read_text())[kind]
    url = f"json://{tmp_path}/json/store" if kind == "json" else \
        f"sqlite://{tmp_path}/sqlite/s.db"
    store = open_store(url)
    conv = store.load("old")
    assert [m.hash for m in conv.messages] == old
    assert conv.title == "old title é" and conv.metadata == {"summary": "old summary"}
    assert conv.messages[0].content == "old question é"
    assert conv.partial is not None and conv.partial.content == "half an old reply"
    assert "AES-256-GCM-SIV" in str(encryption_note(store))
    more = Message.seal(conv.messages[-1], role="assistant", content="a new answer",
                        turn_id="t-1")
    store.append("old", [more])
    store.close()
    again = open_store(url)
    assert [m.hash for m in again.load("old").messages] == [*old, more.hash]
    again.close()
    with keyless():
        raw = open_store(url, keyless=True)
        assert (marker(raw) or {}).get("aead") == "AES-256-GCM-SIV"
        raw.close()
    fresh_url = url_of_new(tmp_path, kind)
    fresh = open_store(fresh_url)
    fresh.create(Conversation(id="new"))
    fresh.append("new", seal_chain(2))
    assert len(fresh.load("new").messages) == 2
    assert "AES-256-GCM," in str(encryption_note(fresh))
    fresh.close()
    with keyless():
        raw = open_store(fresh_url, keyless=True)
        assert (marker(raw) or {}).get("aead") == "AES-256-GCM"
        raw.close()


def url_of_new(root: Path, kind: str) -> str:
    return f"json://{root}/new-store" if kind == "json" else f"sqlite://{root}/new.db"


def test_records_of_both_algorithms_open_in_one_store(tmp_path: Path, key: str) -> None:
    """A store whose mark names AES-256-GCM but whose records were sealed with GCM-SIV
    (the fixture, its mark edited) opens them all and appends with GCM after them."""
    from support import TESTS

    shutil.copytree(TESTS / "fixtures" / "sealed_gcm_siv" / "json", tmp_path / "json")
    mark = tmp_path / "json" / "store" / "chatstate.encryption.json"
    mark.write_text(mark.read_text().replace('"AES-256-GCM-SIV"', '"AES-256-GCM"'))
    url = f"json://{tmp_path}/json/store"
    store = open_store(url)
    conv = store.load("old")
    more = Message.seal(conv.messages[-1], role="assistant", content="sealed with GCM",
                        turn_id="t-1")
    store.append("old", [more])
    store.close()
    again = open_store(url).load("old")
    assert [m.content for m in again.messages][::3] == ["old question é", "sealed with GCM"]


def test_a_json_line_edited_in_the_clear_is_named_by_its_seq(tmp_path: Path, key: str) -> None:
    """The encrypted json load cuts document lines rather than parsing them: a line whose
    clear fields were edited (its time) no longer hashes as stored, and the load names
    its seq; nothing is changed."""
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    store.create(Conversation(id="c"))
    store.append("c", seal_chain(3))
    store.close()  # compaction: one document line per sealed record
    path = tmp_path / "store" / "c.json"
    lines = path.read_bytes().split(b"\n")
    assert lines[2].startswith(b'{"content":[{"data":"')  # the canonical layout, cut on load
    lines[2] = lines[2].replace(b'"created_at":"2', b'"created_at":"1', 1)
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(CorruptTranscriptError) as caught:
        open_store(url).load("c")
    assert caught.value.position == 1 and "seq 1" in str(caught.value)
    assert path.read_bytes() == before


def _format_1(codec: AeadCodec, cid: str, messages: list[Message]) -> list[Message]:
    """``messages`` sealed as builds before format 2 sealed them: the part without ``v``,
    the plaintext the body alone (its chain hash made again on every load)."""
    from chatstate.stores.codec import SEALED_PART

    out: list[Message] = []
    prev_stored: str | None = None
    prev: str | None = None
    for msg in messages:
        record = Message(seq=msg.seq, role="event", created_at=msg.created_at,
                         turn_id="sealed", status=msg.status, content=[{
                             "type": SEALED_PART,
                             "data": codec.seal_text("message", cid, msg.seq, msg.body(),
                                                     prev)}])
        out.append(record.model_copy(update={"hash": chain_hash(prev_stored, record.body())}))
        prev_stored, prev = out[-1].hash, msg.hash
    return out


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_format_1_records_still_open_and_new_ones_are_sealed_in_format_2(
        tmp_path: Path, key: str, kind: str) -> None:
    """A conversation of format 1 records (no ``v`` in the sealed part: what stores held
    before format 2) opens with the same hashes, takes appends, which are stored in
    format 2 after them, and verifies without the key as one chain."""
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    store.create(Conversation(id="c", title="t"))
    old = seal_chain(3)
    assert isinstance(store, SealedStore)
    store.inner.append("c", _format_1(store.codec, "c", old))  # behind the sealing layer
    store.close()
    store = open_store(url)
    assert [m.hash for m in store.load("c").messages] == [m.hash for m in old]
    new = seal_chain(2, old[-1])
    store.append("c", new)
    store.close()
    again = open_store(url).load("c")
    assert [m.hash for m in again.messages] == [m.hash for m in old + new]
    assert [m.content for m in again.messages] == [m.content for m in old + new]
    with keyless():
        raw = open_raw(url)
        stored = raw.load("c")
        assert stored.verify() is None
        assert [m.content[0].get("v") for m in stored.messages] == [None] * 3 + [2, 2]
        raw.close()


def test_a_format_2_record_relabelled_format_1_fails_its_tag(tmp_path: Path, key: str) -> None:
    """The format is bound in the associated data: a record whose ``v`` was removed (and
    the stored chain rebuilt over it, as someone without the key can) does not open."""
    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    body = _body(url, "c1", 0)
    assert ',"v":2}' in body
    _rechain(url, "c1", {0: body.replace(',"v":2}', "}", 1)})
    with pytest.raises(CorruptTranscriptError) as info:
        open_store(url).load("c1")
    assert "conversation 'c1' seq 0" in str(info.value) and "authentication tag" in \
        str(info.value)


def test_the_synthetic_nonce_is_the_hmac_it_always_was(key: str) -> None:
    """The nonce key's HMAC, made from sha256 states kept per key, is HMAC-SHA256 as
    ``hmac`` makes it (so a blob seals to the bytes, and the address, it always had)."""
    import hmac

    codec = AeadCodec(parse_key(KEY, "test"))
    primary = codec._primary
    for size in (0, 1, 55, 64, 65, 700, 5000):
        data = os.urandom(size)
        assert primary.nonce(data) == hmac.digest(primary.nonce_key, data, "sha256")[:12]
    blob = codec.seal_blob(PNG)
    assert blob[12:24] == hmac.digest(primary.nonce_key,
                                      b"chatstate/v1\0blob\0\0\0\0" + PNG, "sha256")[:12]


@pytest.mark.invariant(6)
@pytest.mark.parametrize("field", ["time", "status"])
def test_a_binary_row_edited_in_the_clear_is_refused_by_the_load_with_the_key(
        tmp_path: Path, key: str, field: str) -> None:
    """The load with the key does not hash the stored chain again: it compares each
    binary row's clear fields with the record's authenticated plaintext instead."""
    from chatstate.stores.codec import binary_row, clear_fields

    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    db = sqlite3.connect(local_path(url))
    with db:
        (raw,) = db.execute("SELECT body FROM messages WHERE conversation_id='c2' AND "
                            "seq=1").fetchone()
        assert isinstance(raw, bytes) and raw[:1] == b"\0"  # a binary row
        created, _, status = raw[2:2 + raw[1]].partition(b"\n")
        if field == "time":
            created = b'"2001-01-01T00:00:00+00:00"'
        else:
            status = b'"partial"'
        db.execute("UPDATE messages SET body=? WHERE conversation_id='c2' AND seq=1",
                   (binary_row(clear_fields(created, status), raw[2 + raw[1]:]),))
    db.close()
    store = open_store(url)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c2")
    assert "conversation 'c2' seq 1" in str(info.value)
    assert "fields in the clear" in str(info.value)  # the skip-rehash path caught it
    assert info.value.position == 1
    store.close()


def test_a_build_before_binary_rows_refuses_the_database_untouched(
        tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An encrypted sqlite store written now holds binary rows (schema 10); a chatstate
    that knows 9 steps would read them as damage, so it refuses the database instead,
    saying to upgrade, and changes nothing."""
    from chatstate.stores.sqlite import _conn, _schema

    url = f"sqlite://{tmp_path}/s.db"
    _fill(url)
    path = Path(local_path(url))
    db = sqlite3.connect(path)
    binary = db.execute("SELECT count(*) FROM messages WHERE substr(body, 1, 1) = x'00'"
                        ).fetchone()[0]
    db.close()
    assert binary > 0
    before = path.read_bytes()
    assert _schema.MIGRATIONS[9].name == "m010_sealed_binary_rows"
    monkeypatch.setattr(_conn, "MIGRATIONS", _schema.MIGRATIONS[:9])  # the build before
    with pytest.raises(SchemaVersionError) as info:
        open_store(url).load("c2")
    said = str(info.value)
    assert "schema version 10 is newer than this chatstate knows (9)" in said
    assert "upgrade chatstate" in said and str(path) in said
    assert path.read_bytes() == before


@pytest.mark.invariant(6)
@pytest.mark.parametrize("where", ["document", "log"])
@pytest.mark.parametrize("field", ["time", "status"])
def test_a_json_record_edited_in_the_clear_is_refused_by_the_load_with_the_key(
        tmp_path: Path, key: str, field: str, where: str) -> None:
    """As sqlite's binary rows: the json store's load with the key takes each sealed
    record's clear fields from its document line or its log record without hashing the
    stored chain, and compares them with the authenticated plaintext. An edit someone
    without the key can make (the log record's checksum recomputed) is refused, named."""
    import zlib

    url = f"json://{tmp_path}/s"
    _fill(url)  # closed: c2's two messages are document lines
    store = open_store(url)
    store.append("c2", [Message.seal(store.load("c2").messages[-1], role="user",
                                     content=f"third {SECRET}", turn_id="t-3")])
    path = Path(local_path(url)) / "c2.json"
    raw = path.read_bytes()
    doc_end = raw.index(b"\n]}\n") + 4
    old = b'"status":"complete"'
    new = b'"created_at":"2001-01-01T00:00:00Z"' if field == "time" else b'"status":"partial"'
    if field == "time":
        import re
        old = re.findall(rb'"created_at":"[^"]+"', raw[doc_end:] if where == "log" else
                         raw[:doc_end].split(b"\n")[2])[0]
    if where == "document":
        lines = raw[:doc_end].split(b"\n")
        assert lines[2].count(old) == 1  # seq 1
        lines[2] = lines[2].replace(old, new)
        edited = b"\n".join(lines) + raw[doc_end:]
    else:
        record, crc = raw[doc_end:].rstrip(b"\n").rsplit(b"\t", 1)
        assert record.count(old) == 1 and int(crc, 16) == zlib.crc32(record)
        record = record.replace(old, new)
        edited = raw[:doc_end] + record + b"\t%08x\n" % zlib.crc32(record)
    path.write_bytes(edited)
    reader = open_store(url)
    with pytest.raises(CorruptTranscriptError) as info:
        reader.load("c2")
    seq = 1 if where == "document" else 2
    assert f"conversation 'c2' seq {seq}" in str(info.value)
    assert "fields in the clear" in str(info.value)  # the keyed path caught it
    assert info.value.position == seq
    with pytest.raises(CorruptTranscriptError):  # and the stored chain says so as well
        reader.verified_load("c2")
    assert path.read_bytes() == edited
    reader.close()
    store.close()


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_long_conversation_is_opened_a_chunk_at_a_time(
        tmp_path: Path, key: str, kind: str) -> None:
    """The load with the key takes a long conversation's rows from the store a chunk
    (``ROWS_PER_TAKE``) at a time, each opened before the next is read: the position
    and the plaintext chain hash carry over from chunk to chunk, so every message loads
    as ``verified_load`` reads it, and a record edited in the clear in the third chunk
    is refused, named by its own seq."""
    from chatstate.stores.codec import ROWS_PER_TAKE

    url = f"sqlite://{tmp_path}/s.db" if kind == "sqlite" else f"json://{tmp_path}/s"
    count = 2 * ROWS_PER_TAKE + 7
    store = open_store(url)
    assert isinstance(store, SealedStore)
    store.create(Conversation(id="long"))
    msgs = seal_chain(count, prefix=f"msg {SECRET}")
    store.append("long", msgs)
    store.close()
    reader = open_store(url)
    assert isinstance(reader, SealedStore)
    fast = reader._keyed_load("long")  # the chunked path, not the verified one
    assert fast is not None
    assert [m.hash for m in fast.messages] == [m.hash for m in msgs]
    assert fast.messages == reader.verified_load("long").messages
    assert [m.content for m in fast.messages] == [m.content for m in msgs]

    seq = 2 * ROWS_PER_TAKE + 3
    old, new = b'"complete"', b'"xomplete"'  # same length: a binary row's stays right
    if kind == "sqlite":
        db = sqlite3.connect(local_path(url))
        (body,) = db.execute("SELECT body FROM messages WHERE conversation_id='long' AND "
                             "seq=?", (seq,)).fetchone()
        assert body.count(old) == 1
        db.execute("UPDATE messages SET body=? WHERE conversation_id='long' AND seq=?",
                   (body.replace(old, new), seq))
        db.commit()
        db.close()
    else:
        path = Path(local_path(url)) / "long.json"
        lines = path.read_bytes().split(b"\n")
        assert lines[1 + seq].count(old) == 1
        lines[1 + seq] = lines[1 + seq].replace(old, new)
        path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptTranscriptError) as info:
        open_store(url).load("long")
    assert f"conversation 'long' seq {seq}" in str(info.value)
    assert "fields in the clear" in str(info.value)
    assert info.value.position == seq


@pytest.mark.parametrize("sealed", [True, False])
def test_the_note_of_an_interrupted_reply_names_its_seq_not_a_wrong_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sealed: bool) -> None:
    """A json store opened after a writer was killed mid-reply notes the partial reply it
    kept. It said "(N chars" from the stored content's length: for an encrypted store
    that is the one sealed part ("1 chars" for a reply of any length), for a reply in
    parts the number of parts. It names the reply's seq instead, the same on both."""
    if sealed:
        monkeypatch.setenv("CHATSTATE_ENCRYPTION_KEY", KEY)
    else:
        monkeypatch.delenv("CHATSTATE_ENCRYPTION_KEY", raising=False)
    url = f"json://{tmp_path}/s"
    store = open_store(url)
    store.create(Conversation(id="c1"))
    msgs = seal_chain(1)
    store.append("c1", msgs)
    store.save_partial("c1", Message.seal(msgs[-1], role="assistant", status="partial",
                                          content="a reply cut off after forty characters",
                                          turn_id="t-1"))
    reader = open_store(url)
    notes = [n for n in reader.recovery if "interrupted reply" in n]
    assert notes == ["c1: found an interrupted reply (seq 1), kept as partial"], notes
    assert reader.load("c1").partial is not None
