"""Disk faults: a clear error, the previous transcript intact, and no false acknowledgement.

JSON: ENOSPC and EIO are injected (monkeypatched ``os``, only for files of the
store under test) into each step of the atomic write: create the temp file,
write, fsync it, rename, open the directory, fsync the directory. Every fault
gives ``StoreUnavailable`` naming the file; no temp file is left; the transcript
loads intact; a retry while the fault persists never reports success (a failed
fsync is never acknowledged later); the retry after the fault clears lands once.

SQLite: ``PRAGMA max_page_count`` makes the database full (SQLITE_FULL).
Both: ``RLIMIT_FSIZE`` in a child process makes a big append fail with EFBIG.
Modes: under umask 000 every file is 0600 and every directory the store made 0700.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.stores import (
    local_path,
    new_conversation,
    run_writer,
    seal_chain,
    snapshot,
    temp_files,
)

from chatstate.core.transcript import Message
from chatstate.errors import StoreUnavailable
from chatstate.stores import open_store

# -- JSON: faults injected into each step of the atomic write ---------------------------------


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


class Faults:
    """Make one os-level step fail for files under ``root`` while ``armed``."""

    def __init__(self, root: Path, step: str, code: int) -> None:
        self.root, self.step, self.code = str(root), step, code
        self.armed = True
        self.fired = 0

    def _hit(self, step: str, path: str) -> bool:
        if self.armed and step == self.step and path.startswith(self.root):
            self.fired += 1
            return True
        return False

    def _fail(self, path: str) -> OSError:
        return OSError(self.code, os.strerror(self.code), path)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_open, real_write = os.open, os.write
        real_fsync, real_replace = os.fsync, os.replace

        def fake_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
            p = os.fspath(path)
            name = os.path.basename(p)
            if flags & os.O_DIRECTORY and self._hit("open-dir", str(p)):
                raise self._fail(str(p))
            if flags & os.O_CREAT and ".tmp-" in str(name) and self._hit("open-temp", str(p)):
                raise self._fail(str(p))
            return real_open(path, flags, *args, **kw)

        def fake_write(fd: int, data: Any) -> int:
            p = _fd_path(fd)
            if _written(p) and self._hit("write", p):
                raise self._fail(p)
            return real_write(fd, data)

        def fake_fsync(fd: int) -> None:
            p = _fd_path(fd)
            step = "fsync-file" if _written(p) else (
                "fsync-dir" if os.path.isdir(p) else "fsync-other")
            if self._hit(step, p):
                raise self._fail(p)
            real_fsync(fd)

        def fake_replace(src: Any, dst: Any, **kw: Any) -> None:
            if self._hit("replace", os.fspath(src)):
                raise self._fail(os.fspath(dst))
            real_replace(src, dst, **kw)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "write", fake_write)
        monkeypatch.setattr(os, "fsync", fake_fsync)
        monkeypatch.setattr(os, "replace", fake_replace)


def _written(path: str) -> bool:
    """A file a store writes data into: a temp file, the json partial-reply log, which
    a flush appends to in place (one fsync instead of rename + directory), or a json
    conversation file, to whose end an append writes its log record the same way."""
    base = os.path.basename(path)
    return (".tmp-" in base or f"{os.sep}.partials{os.sep}" in path
            or (base.endswith(".json") and not base.startswith(".")))


BEFORE_RENAME = ["open-temp", "write", "fsync-file", "replace"]
AFTER_RENAME = ["open-dir", "fsync-dir"]
LOG_APPEND = ["write", "fsync-file"]  # an append writes a record to the file's end: no rename
CODES = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


@pytest.fixture
def json_store(tmp_path: Path) -> Iterator[Any]:
    store = open_store(f"json://{tmp_path}/store")
    yield store
    store.close()


@pytest.mark.invariant(3, 4)
@pytest.mark.parametrize("code", CODES.values(), ids=CODES.keys())
@pytest.mark.parametrize("step", LOG_APPEND)
def test_json_append_fault(json_store: Any, monkeypatch: pytest.MonkeyPatch, step: str,
                           code: int) -> None:
    store, root = json_store, local_path(json_store.url)
    msgs = new_conversation(store, "c1", 3)
    path = root / "c1.json"
    before = path.read_bytes()
    nxt = seal_chain(2, msgs[-1])
    faults = Faults(root, step, code)
    faults.install(monkeypatch)
    with pytest.raises(StoreUnavailable) as info:
        store.append("c1", nxt)
    assert faults.fired
    text = str(info.value)
    assert str(path) in text
    assert errno.errorcode[code] in text
    assert "retry" in text.lower()
    if step in BEFORE_RENAME:
        assert "unchanged" in text
    else:  # the new file is in place: saying "unchanged" would be false
        assert "unchanged" not in text
        assert "renamed into place" in text
    assert temp_files(root) == []
    if step in BEFORE_RENAME:
        assert path.read_bytes() == before  # not a byte moved
    loaded = store.load("c1")
    assert loaded.verify() is None
    assert loaded.messages[:3] == msgs
    # outcome unknown: a retry while the disk still fails must not be acknowledged
    with pytest.raises(StoreUnavailable):
        store.append("c1", nxt)
    faults.armed = False
    store.append("c1", nxt)  # the retry once the fault clears lands exactly once
    store.append("c1", nxt)
    for fresh in (store, open_store(store.url)):
        conv = fresh.load("c1")
        assert conv.messages == [*msgs, *nxt]
        assert conv.verify() is None
    assert temp_files(root) == []


@pytest.mark.parametrize("step", ["write", "fsync-file", "replace"])
def test_json_partial_and_header_faults(json_store: Any, monkeypatch: pytest.MonkeyPatch,
                                        step: str) -> None:
    store, root = json_store, local_path(json_store.url)
    msgs = new_conversation(store, "c1", 1, title="kept")
    old = Message.seal(msgs[-1], role="assistant", content="old", turn_id="t",
                       status="partial")
    store.save_partial("c1", old)
    before = snapshot(root)
    faults = Faults(root, step, errno.ENOSPC)
    faults.install(monkeypatch)
    newer = old.model_copy(update={"content": "newer"})
    if step == "replace":  # a flush appends to the partial log: there is no rename to fail
        store.save_partial("c1", newer)
        store.save_partial("c1", old)
        before = snapshot(root)
    else:
        with pytest.raises(StoreUnavailable, match="disk is full"):
            store.save_partial("c1", newer)  # the failed append is cut off again
    with pytest.raises(StoreUnavailable, match="disk is full"):
        store.set_header("c1", title="lost")
    faults.armed = False
    assert snapshot(root) == before
    assert temp_files(root) == []
    conv = store.load("c1")
    assert (conv.title, conv.partial, conv.messages) == ("kept", old, msgs)


@pytest.mark.invariant(3)
def test_json_failed_log_fsync_is_never_acknowledged(
        json_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record was written but its fsync failed: no later call may call it durable."""
    store, root = json_store, local_path(json_store.url)
    msgs = new_conversation(store, "c1", 1)
    reply = seal_chain(1, msgs[-1])
    faults = Faults(root, "fsync-file", errno.EIO)
    faults.install(monkeypatch)
    with pytest.raises(StoreUnavailable, match="Input/output error"):
        store.append("c1", reply)
    assert store.load("c1").messages == msgs  # the unacknowledged record was cut off again
    fired = faults.fired
    with pytest.raises(StoreUnavailable):
        store.append("c1", reply)  # the retry must fsync, and fails
    assert faults.fired > fired
    faults.armed = False
    store.append("c1", reply)
    assert store.load("c1").messages == [*msgs, *reply]


@pytest.mark.invariant(3, 4)
@pytest.mark.parametrize("step", BEFORE_RENAME + AFTER_RENAME)
def test_json_compaction_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               step: str) -> None:
    """Compaction (the log folded into the document: temp, fsync, rename, fsync the
    directory) failing at any step loses nothing, leaves no temp file, and is redone."""
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    root = local_path(url)
    msgs = new_conversation(store, "c1", 3)
    path = root / "c1.json"
    before = path.read_bytes()
    faults = Faults(root, step, errno.EIO)
    faults.install(monkeypatch)
    store.close()  # compacts: the fault is reported, not raised (the appends were durable)
    assert faults.fired
    assert any(str(path) in line and "EIO" in line for line in store.recovery), store.recovery
    faults.armed = False
    assert temp_files(root) == []
    if step in BEFORE_RENAME:
        assert path.read_bytes() == before
    again = open_store(url)
    assert again.load("c1").messages == msgs
    nxt = seal_chain(1, msgs[-1])
    again.append("c1", nxt)
    again.close()
    assert path.read_bytes().endswith(b"\n]}\n")  # compacted this time
    assert open_store(url).load("c1").messages == [*msgs, *nxt]


# -- SQLite: the database is full ----------------------------------------------------------


@pytest.mark.invariant(3)
def test_sqlite_full_is_a_clear_error_and_recovers(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/s.db")
    msgs = new_conversation(store, "c1", 3)
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count={pages + 2}")
    big = Message.seal(msgs[-1], role="user", content="z" * 200_000, turn_id="t-big")
    with pytest.raises(StoreUnavailable) as info:
        store.append("c1", [big])
    text = str(info.value)
    assert str(tmp_path / "s.db") in text
    assert "SQLITE_FULL" in text
    assert "free space" in text
    conv = store.load("c1")
    assert conv.messages == msgs
    assert conv.verify() is None
    assert store.list_conversations()[0].message_count == 3
    store.db.execute("PRAGMA max_page_count=1073741823")
    store.append("c1", [big])
    store.append("c1", [big])  # and a retry does not duplicate
    store.close()
    again = open_store(f"sqlite://{tmp_path}/s.db")
    assert again.load("c1").messages == [*msgs, big]
    again.close()


# -- RLIMIT_FSIZE in a child: EFBIG ------------------------------------------------------------


def test_file_size_limit_gives_a_clear_error(local_store_url: str) -> None:
    store = open_store(local_store_url)
    msgs = new_conversation(store, "c1", 2)
    store.close()
    result = run_writer("fsize", local_store_url, "c1", str(256 * 1024), str(2 * 1024 * 1024))
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["type"] == "StoreUnavailable", outcome
    path = local_path(local_store_url)
    assert str(path) in outcome["message"]
    assert "ulimit -f" in outcome["message"]
    if local_store_url.startswith("json"):
        assert "EFBIG" in outcome["message"]
        assert temp_files(path) == []
    store = open_store(local_store_url)
    conv = store.load("c1")
    assert conv.messages == msgs
    assert conv.verify() is None
    nxt = seal_chain(1, msgs[-1])
    store.append("c1", nxt)
    assert store.load("c1").messages == [*msgs, *nxt]
    store.close()


# -- modes under umask 000 -------------------------------------------------------------------


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
            for p in [root, *root.rglob("*")]}


def _exercise(url: str) -> Callable[[], None]:
    store = open_store(url)
    msgs = new_conversation(store, "c1", 2)
    store.save_partial("c1", Message.seal(msgs[-1], role="user", content="p", turn_id="t",
                                          status="partial"))
    store.set_header("c1", title="t")
    assert store.check().ok
    return store.close


@pytest.mark.invariant(9)
def test_modes_under_umask_000_json(tmp_path: Path) -> None:
    root = tmp_path / "made" / "by" / "store"
    with umask(0):
        close = _exercise(f"json://{root}")
        modes = _modes(tmp_path / "made")
        close()
    expected_files = {"by/store/c1.json", "by/store/.partials/c1.json",
                      "by/store/.locks/c1.lock", "by/store/.chatstate/opens.jsonl"}
    assert expected_files <= set(modes)
    for name, mode in modes.items():
        is_dir = (tmp_path / "made" / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name}: {oct(mode)}"


@pytest.mark.invariant(9)
def test_modes_under_umask_000_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "made" / "by" / "s.db"
    with umask(0):
        close = _exercise(f"sqlite://{db}")
        modes = _modes(tmp_path / "made")  # while open: -wal and -shm exist
        close()
    assert {"by/s.db", "by/s.db-wal", "by/s.db-shm"} <= set(modes), modes
    for name, mode in modes.items():
        is_dir = (tmp_path / "made" / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name}: {oct(mode)}"
