"""Tier 3 disk faults: real ENOSPC, EROFS and EACCES from real mounts and permissions.

Each test holds a private mount namespace (``unshare -m``, kept alive by a
sleeping process) and runs every command inside it with ``nsenter``, so the
mounts vanish with the namespace whatever happens. The writer is
``tests/support/fault_writer.py`` (library) or the ``chatstate`` CLI, always in a
process of its own.

- ENOSPC: a loop-mounted ext4 image (``mkfs.ext4 -m 0``, so root has no reserve;
  the guard calls it durable) is filled while a writer has the store open: the
  turn fails with StoreUnavailable naming the path and saying the disk is full;
  what was stored still loads; after the filler is deleted the writer's retry
  of the same sealed messages lands each once. Then a fresh process on the
  full disk: ``ask`` fails clearly, ``replay`` still shows the transcript.
- EROFS: a read-only bind mount (``mount --bind``, ``remount,ro,bind``), both
  under a writer that opened the store before, and for a fresh process.
- EACCES: a read-only store directory and an unsearchable one, as an ordinary user
  would meet them: root drops every capability first (``setpriv``), so no other
  user needs to reach the checkout or the venv.

Whatever the machine does not allow skips with the reason (fails under
``CHATSTATE_REQUIRE_TIERS=1``, see ``tests/support/tiers.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import CHATSTATE, cli_env
from support.faultlib import CID, PYTHON, WRITER, assert_clear_error, require_tool, run
from support.tiers import need

pytestmark = pytest.mark.slow


class Namespace:
    """A private mount namespace; ``run`` executes a command inside it."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(["unshare", "-m", "--propagation", "private",
                                        "sleep", "infinity"])
        mine = os.readlink("/proc/self/ns/mnt")
        while os.readlink(f"/proc/{self.holder.pid}/ns/mnt") == mine:
            assert self.holder.poll() is None, "unshare -m exited"

    def run(self, *args: str | Path, check: bool = True,
            **kw: Any) -> subprocess.CompletedProcess[str]:
        result = run("nsenter", "-t", str(self.holder.pid), "-m", *args, **kw)
        if check:
            assert result.returncode == 0, f"{args}: {result.stderr}"
        return result

    def writer(self, *args: str) -> Any:
        result = self.run(PYTHON, WRITER, *args)
        return json.loads(result.stdout)

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


def namespace_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mounting needs root"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = run("unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs",
                "-o", "size=64k", "tmpfs", "/mnt")
    if probe.returncode != 0:
        return f"no private mount namespace with mounts here: {probe.stderr.strip()}"
    return None


@pytest.fixture
def ns() -> Iterator[Namespace]:
    reason = namespace_unavailable()
    need("mount namespace", reason is None, reason or "")
    space = Namespace()
    try:
        yield space
    finally:
        space.close()


def url_under(kind: str, root: Path) -> str:
    return f"json://{root}/store" if kind == "json" else f"sqlite://{root}/db/s.db"


def store_dir(kind: str, root: Path) -> Path:
    return root / "store" if kind == "json" else root / "db"


def cli(ns: Namespace, url: str, *args: str, env: dict[str, str],
        ) -> subprocess.CompletedProcess[str]:
    return ns.run(CHATSTATE, "--store", url, *args, check=False, env=env)


def assert_unchanged(ns: Namespace, url: str, before: list[str]) -> None:
    found = ns.writer("check", url, CID)
    assert found.get("hashes") == before, found
    assert found.get("verify") is None, found


# -- ENOSPC ------------------------------------------------------------------------------

def loop_ext4(ns: Namespace, tmp_path: Path) -> Path:
    require_tool("mkfs.ext4", "losetup", tier="loop device")
    need("loop device", os.path.exists("/dev/loop-control"),
         "no loop devices (/dev/loop-control missing)")
    image, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(8 << 20)
    made = run("mkfs.ext4", "-q", "-m", "0", "-F", image)
    assert made.returncode == 0, made.stderr
    mounted = ns.run("mount", "-o", "loop", image, mnt, check=False)
    need("loop device", mounted.returncode == 0,
         f"cannot loop-mount an ext4 image here: {mounted.stderr.strip()}")
    return mnt


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_disk_fills_under_a_running_writer(ns: Namespace, tmp_path: Path, kind: str) -> None:
    mnt = loop_ext4(ns, tmp_path)
    url = url_under(kind, mnt)
    before = ns.writer("populate", url, CID, "6")
    out = ns.writer("append", url, CID, "--fill", str(mnt / "filler"))
    assert out["filled"] > 4 << 20, out  # the disk really was full
    [error] = out["errors"]
    assert error["at"] == "append", out
    assert error["type"] == "StoreUnavailable", out
    assert str(store_dir(kind, mnt)) in error["message"], error
    assert "full" in error["message"], error
    assert "free space" in error["message"], error
    assert out["loaded"] == len(before), "what was stored no longer loads on a full disk"
    assert out["retried"]
    assert out["acked"] == []
    sealed = [m["hash"] for m in out["sealed"]]
    assert_unchanged(ns, url, before + sealed)


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_fresh_process_on_a_full_disk(ns: Namespace, tmp_path: Path, kind: str) -> None:
    """``ask`` fails with one clear paragraph saying the disk is full, ``replay`` still shows
    the transcript, earlier turns stay intact, and once space is freed ``ask`` works."""
    mnt = loop_ext4(ns, tmp_path)
    url = url_under(kind, mnt)
    before = ns.writer("populate", url, CID, "6")
    ns.writer("fill", str(mnt / "filler"))
    env = cli_env(tmp_path)
    asked = cli(ns, url, "ask", "--model", "fake", "--id", CID, "one more", env=env)
    assert asked.returncode == 1, asked
    assert_clear_error(asked.stderr, store_dir(kind, mnt))
    assert "full" in asked.stderr, asked.stderr
    shown = cli(ns, url, "replay", CID, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("question pre-") == len(before) // 2
    ns.run("rm", mnt / "filler")
    # the user's message may have landed in the slack of a block: the turn is interrupted
    found = ns.writer("check", url, CID)
    assert found["hashes"][:len(before)] == before, found
    assert found["verify"] is None, found
    again = cli(ns, url, "ask", "--model", "fake", "--id", CID, "one more", env=env)
    assert again.returncode == 0, again.stderr


# -- EROFS -------------------------------------------------------------------------------

def read_only_view(ns: Namespace, tmp_path: Path) -> tuple[Path, Path]:
    data, view = tmp_path / "data", tmp_path / "view"
    data.mkdir()
    view.mkdir()
    ns.run("mount", "--bind", data, view)
    return data, view


def remount_ro(ns: Namespace, view: Path) -> None:
    done = ns.run("mount", "-o", "remount,ro,bind", view, check=False)
    need("mount namespace", done.returncode == 0,
         f"cannot remount a bind mount read-only here: {done.stderr.strip()}")


def test_mount_turns_read_only_under_a_running_writer(ns: Namespace, tmp_path: Path) -> None:
    """json only: the kernel refuses (EBUSY) to remount read-only while files on it are open
    for writing, and a SQLite connection always holds its database and WAL open. SQLite on
    a read-only mount is covered by the fresh-process test below."""
    _data, view = read_only_view(ns, tmp_path)
    url = url_under("json", view)
    before = ns.writer("populate", url, CID, "6")
    proc = subprocess.Popen(["nsenter", "-t", str(ns.holder.pid), "-m", PYTHON, str(WRITER),
                             "append", url, CID, "--wait"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "opened\n"
    remount_ro(ns, view)
    out = json.loads(proc.communicate("go\n", timeout=60)[0])
    [error] = out["errors"]
    assert error["type"] == "StoreUnavailable", error
    assert "EROFS" in error["message"], error
    assert "read-only" in error["message"], error
    assert str(store_dir("json", view)) in error["message"], error
    assert out["loaded"] == len(before)
    assert out["acked"] == []
    ns.run("mount", "-o", "remount,rw,bind", view)
    assert_unchanged(ns, url, before)


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_fresh_process_on_a_read_only_mount(ns: Namespace, tmp_path: Path, kind: str) -> None:
    """``ask`` fails with one clear paragraph and no byte changes; ``replay`` still works."""
    data, view = read_only_view(ns, tmp_path)
    url = url_under(kind, view)
    before = ns.writer("populate", url, CID, "6")
    remount_ro(ns, view)
    env = cli_env(tmp_path)
    snapshot = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    asked = cli(ns, url, "ask", "--model", "fake", "--id", CID, "hello", env=env)
    assert asked.returncode == 1, asked
    assert_clear_error(asked.stderr, store_dir(kind, view))
    # json says EROFS; SQLite only reports SQLITE_CANTOPEN (it cannot create the -shm), so
    # the store looks at the mount itself and says what is wrong, not "could not read"
    assert "read-only" in asked.stderr, asked.stderr
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == snapshot
    shown = cli(ns, url, "replay", CID, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("question pre-") == len(before) // 2
    assert "could not read" not in shown.stderr + asked.stderr
    if kind == "sqlite":
        assert "mounted read-only; remount it read-write" in shown.stderr, shown.stderr
        assert "reading works, writes will fail" in shown.stderr, shown.stderr


def test_read_only_sqlite_with_an_absolute_four_slash_url(ns: Namespace, tmp_path: Path) -> None:
    """``sqlite:////abs/path`` (SQLAlchemy's spelling) opens read-only too: the read-only
    URI once read its first path segment as a host ("invalid uri authority")."""
    _data, view = read_only_view(ns, tmp_path)
    url = url_under("sqlite", view)
    before = ns.writer("populate", url, CID, "2")
    remount_ro(ns, view)
    four = "sqlite:////" + url.removeprefix("sqlite://").lstrip("/")
    shown = cli(ns, four, "replay", CID, env=cli_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("question pre-") == len(before) // 2


# -- EACCES ------------------------------------------------------------------------------

UNPRIVILEGED = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
"""Root with every capability dropped: file modes bind it as they bind any user, yet it
still owns (and so reaches) the checkout and the venv, even inside a 0700 home."""


def as_user(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command as an ordinary user would: root drops its capabilities first."""
    if os.geteuid() == 0:
        require_tool("setpriv", tier="capability drop")
        return run(*UNPRIVILEGED, *args, env=env)
    return run(*args, env=env)


def test_unprivileged_really_meets_file_modes(tmp_path: Path) -> None:
    """The premise of the two tests below: without capabilities root cannot write a 0555
    directory it owns, while it still runs the venv's interpreter."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    done = as_user(PYTHON, "-c", f"open({str(locked / 'x')!r}, 'w')", env=dict(os.environ))
    assert done.returncode == 1, done
    assert "PermissionError" in done.stderr, done


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_read_only_directory_as_an_ordinary_user(tmp_path: Path, kind: str) -> None:
    """``ask`` fails clearly and nothing changes."""
    url = url_under(kind, tmp_path / "data")
    env = cli_env(tmp_path)
    populated = run(PYTHON, WRITER, "populate", url, CID, "6")
    assert populated.returncode == 0, populated.stderr
    before = json.loads(populated.stdout)
    locked = store_dir(kind, tmp_path / "data")
    locked.chmod(0o555)
    try:
        asked = as_user(CHATSTATE, "--store", url, "ask", "--model", "fake", "--id", CID,
                        "hello", env=env)
    finally:
        locked.chmod(0o700)
    assert asked.returncode == 1, asked
    assert_clear_error(asked.stderr, locked)
    assert "ermission" in asked.stderr, asked.stderr
    found = json.loads(run(PYTHON, WRITER, "check", url, CID).stdout)
    assert found.get("hashes") == before, found
    assert found.get("verify") is None, found


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_store_path_not_searchable_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    """A store below a directory this user may not enter: a store error, not a crash."""
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o000)
    url = url_under(kind, secret)
    try:
        listed = as_user(CHATSTATE, "--store", url, "list",
                         env=cli_env(tmp_path, HOME="/nonexistent"))
    finally:
        secret.chmod(0o700)
    assert listed.returncode == 1, listed
    assert_clear_error(listed.stderr, secret)
    assert "ermission" in listed.stderr, listed.stderr
