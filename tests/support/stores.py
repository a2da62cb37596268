"""Helpers shared by the store tests: sealing chains, peeking at a store's bytes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from chatstate.core.transcript import Conversation, Message
from chatstate.stores.codec import expand_row
from chatstate.testing.store_contract import (  # the shipped suite's own helpers
    new_conversation as new_conversation,
)
from chatstate.testing.store_contract import seal_chain as seal_chain

TESTS_DIR = Path(__file__).resolve().parent
CRASH_WRITER = TESTS_DIR / "crash_writer.py"


def scheme(url: str) -> str:
    return url.split("://", 1)[0]


def local_path(url: str) -> Path:
    """The json store's directory or the sqlite store's file."""
    parsed = urlparse(url)
    return Path(parsed.netloc + parsed.path)


def pg_connect(url: str) -> Any:
    """A psycopg connection to a postgresql:// store URL's schema (autocommit)."""
    import psycopg

    base, _, query = url.partition("?")
    schema = dict(p.split("=", 1) for p in query.split("&") if p).get("schema", "chatstate")
    return psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}")


def load_once(url: str, cid: str) -> Conversation:
    """``cid`` as a fresh open of ``url`` loads it (ConversationNotFound if absent)."""
    from chatstate.stores import open_store

    store = open_store(url)
    try:
        conv: Conversation = store.load(cid)
        return conv
    finally:
        store.close()


def fresh_load(url: str, cid: str) -> Conversation:
    """``cid`` as a fresh open of ``url`` sees it; empty if no writer got to create it."""
    from chatstate.errors import ConversationNotFound
    from chatstate.stores import open_store

    store = open_store(url)
    try:
        conv: Conversation = store.load(cid)
        return conv
    except ConversationNotFound:  # the first writer died before creating it
        return Conversation(id=cid)
    finally:
        store.close()


def temp_files(root: Path) -> list[Path]:
    """Temp files of the atomic-write protocol anywhere under ``root``."""
    return sorted(p for p in root.rglob(".*") if ".tmp-" in p.name)


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or the file itself) -> its bytes."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def run_writer(*args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``tests/support/crash_writer.py`` with ``args`` to completion."""
    return subprocess.run([sys.executable, str(CRASH_WRITER), *args], capture_output=True,
                          text=True, timeout=timeout, check=False, **kw)


def spawn_writer(*args: str) -> subprocess.Popen[str]:
    """Start ``tests/support/crash_writer.py`` with pipes on stdin and stdout."""
    return subprocess.Popen([sys.executable, str(CRASH_WRITER), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def parse_acks(stdout: str) -> list[tuple[int, str]]:
    """The (seq, hash) of every complete ``ack`` line a writer printed."""
    acks = []
    for line in stdout.splitlines(keepends=True):
        parts = line.split()
        if line.endswith("\n") and len(parts) == 3 and parts[0] == "ack":
            acks.append((int(parts[1]), parts[2]))
    return acks


def assert_acked_present(messages: Sequence[Message], acks: Sequence[tuple[int, str]]) -> None:
    """Every acknowledged message is stored, at its seq, exactly once."""
    hashes = [m.hash for m in messages]
    for seq, h in acks:
        assert seq < len(messages), f"acknowledged seq {seq} lost (store has {len(messages)})"
        assert messages[seq].hash == h, f"acknowledged seq {seq} replaced by another message"
        assert hashes.count(h) == 1, f"acknowledged seq {seq} stored more than once"


def tamper(url: str, store: Any, cid: str, seq: int, edit: tuple[str, str] | None = None
           ) -> None:
    """Edit message ``seq``'s content behind the store's back, the way each kind allows.

    Made by ``seal_chain`` (content ``msg <seq>``); its stored hash is left as it was,
    so the chain no longer verifies at ``seq``. ``edit``: (old, new) text to replace
    instead (an encrypted store's sealed record).
    """
    old, new = edit or (f'"msg {seq}"', f'"msg {seq}, edited"')
    if scheme(url) == "json":
        file = local_path(url) / f"{cid}.json"
        text = file.read_text()
        assert old in text
        file.write_text(text.replace(old, new, 1))
    elif scheme(url) == "sqlite":
        db = sqlite3.connect(local_path(url))
        with db:
            (body,) = db.execute("SELECT body FROM messages WHERE conversation_id=? AND seq=?",
                                 (cid, seq)).fetchone()
            if isinstance(body, bytes) and body[:1] == b"\0":  # a sealed record's binary row
                body = expand_row(seq, body).decode()  # edited as the text it stands for
            assert old in body
            db.execute("UPDATE messages SET body=? WHERE conversation_id=? AND seq=?",
                       (body.replace(old, new), cid, seq))
        db.close()
    elif scheme(url) == "postgresql":
        with pg_connect(url) as db:
            changed = db.execute("UPDATE messages SET body=replace(body, %s, %s) WHERE "
                                 "conversation_id=%s AND seq=%s", (old, new, cid, seq)).rowcount
        assert changed == 1
    else:
        key = f"conversations/{cid}/m/{seq:010d}.json"
        blob = store.io.get(key)
        assert blob is not None
        assert old.encode() in blob.data
        store.io.put(key, blob.data.replace(old.encode(), new.encode()))


def stored_state(url: str, store: Any) -> dict[str, bytes]:
    """Everything a conversation write could change (not the open records), to compare."""
    if scheme(url) == "json":
        return {k: v for k, v in snapshot(local_path(url)).items() if ".chatstate" not in k}
    if scheme(url) == "sqlite":
        db = sqlite3.connect(local_path(url))
        try:
            return {table: repr(db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall())
                    .encode() for table in ("conversations", "messages", "partials")}
        finally:
            db.close()
    if scheme(url) == "postgresql":
        with pg_connect(url) as db:
            return {table: repr(db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall())
                    .encode() for table in ("conversations", "messages", "partials")}
    out = {}
    for prefix in ("conversations", "index"):
        for key, _ in store.io.keys(prefix):
            blob = store.io.get(key)
            out[key] = blob.data if blob is not None else b""
    return out


def damage_blob(store: Any, url: str, sha: str, how: str) -> str:
    """Remove, alter or truncate the stored blob; return the name the error must give."""
    def damaged(data: bytes) -> bytes:
        return data[:1000] if how == "truncated" else b"X" + data[1:]

    if scheme(url) == "json":
        path = local_path(url) / "blobs" / sha
        if how == "missing":
            path.unlink()
        else:
            path.write_bytes(damaged(path.read_bytes()))
        return str(path)
    if scheme(url) == "sqlite":
        db = sqlite3.connect(local_path(url))
        with db:
            if how == "missing":
                db.execute("DELETE FROM blobs WHERE sha256=?", (sha,))
            else:
                data = db.execute("SELECT data FROM blobs WHERE sha256=?", (sha,)).fetchone()[0]
                db.execute("UPDATE blobs SET data=? WHERE sha256=?", (damaged(data), sha))
        db.close()
        return f"blob {sha}"
    if scheme(url) == "postgresql":
        with pg_connect(url) as conn:
            if how == "missing":
                conn.execute("DELETE FROM blobs WHERE sha256=%s", (sha,))
            else:
                data = conn.execute("SELECT data FROM blobs WHERE sha256=%s",
                                    (sha,)).fetchone()[0]
                conn.execute("UPDATE blobs SET data=%s WHERE sha256=%s", (damaged(data), sha))
        return f"blob {sha}"
    key = f"blobs/{sha}"
    if how == "missing":
        store.io.delete([key])
    else:
        store.io.put(key, damaged(store.io.get(key).data))
    return key


class DamageHooks:
    """``StoreContract``'s damage hooks for the built-in stores, by URL (json, sqlite, s3
    on moto or SeaweedFS, postgresql): mixed into each contract class that runs on them."""

    def damage(self, store_url: str, conversation_id: str, seq: int) -> None:
        from chatstate.stores import open_store

        store = open_store(store_url)
        try:
            tamper(store_url, store, conversation_id, seq)
        finally:
            store.close()

    def damage_blob(self, store_url: str, sha256: str, how: str) -> None:
        from chatstate.stores import open_store

        store = open_store(store_url)
        try:
            damage_blob(store, store_url, sha256, how)
        finally:
            store.close()


def sealed_as_is(prev: Message | None, *, content: Any, **fields: Any) -> Message:
    """The next message after ``prev`` holding ``content`` exactly as given, hash and all:
    ``Message.seal`` makes text well formed (a lone surrogate becomes U+FFFD), and a store
    must still refuse, writing nothing, a message made some other way that it cannot write."""
    draft = Message.seal(prev, content="", **fields).model_copy(update={"content": content})
    return draft.model_copy(update={"hash": draft.expected_hash(prev.hash if prev else None)})
