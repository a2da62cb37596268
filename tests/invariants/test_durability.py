"""The durability guard: ephemeral locations are refused before the first write.

Proves: json and sqlite stores under /dev/shm (tmpfs) and /tmp are refused with
``EphemeralStoreError`` saying where, why and both fixes, and nothing is created
there; ``allow_ephemeral=True`` and ``CHATSTATE_ALLOW_EPHEMERAL=1`` allow them;
a path in the checkout (the root disk) is ``durable`` with an ok probe; every
reason reads as a sentence; a fake mount table (overlay root, tmpfs, a bind
volume, nfs, an unknown and an over-mounted filesystem, escaped names) gives the
right mounts and verdicts; a path that does not exist is inspected through its
nearest ancestor, with the probe skipped and nothing written.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stores import new_conversation

from chatstate.durable import guard as durability
from chatstate.durable.guard import inspect, mount_for, read_mounts
from chatstate.errors import EphemeralStoreError
from chatstate.stores import open_store


@pytest.fixture
def scratch_dirs() -> Iterator[dict[str, Path]]:
    """Fresh, not-yet-existing names under /dev/shm and /tmp; removed afterwards."""
    token = f"chatstate-test-{os.getpid()}-{secrets.token_hex(4)}"
    dirs = {"shm": Path("/dev/shm") / token, "tmp": Path("/tmp") / token}
    yield dirs
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)


def _url(kind: str, base: Path) -> str:
    return f"json://{base}/store" if kind == "json" else f"sqlite://{base}/s.db"


def _assert_sentences(reasons: list[str]) -> None:
    assert reasons
    for reason in reasons:
        assert reason[0].isupper(), reason
        assert reason.endswith("."), reason


@pytest.mark.invariant(8)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
@pytest.mark.parametrize("where", ["shm", "tmp"])
def test_ephemeral_locations_are_refused(scratch_dirs: dict[str, Path], where: str, kind: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATSTATE_ALLOW_EPHEMERAL", raising=False)
    base = scratch_dirs[where]
    url = _url(kind, base)
    with pytest.raises(EphemeralStoreError) as info:
        open_store(url)
    text = str(info.value)
    assert url in text  # where
    why = "tmpfs" if where == "shm" else "under /tmp"
    assert why in text
    assert "would not survive a restart" in text  # why
    assert "CHATSTATE_STORE" in text  # fix 1: point it at durable storage
    for allow in ("allow_ephemeral=True", "CHATSTATE_ALLOW_EPHEMERAL=1", "--allow-ephemeral"):
        assert allow in text  # fix 2: accept the loss explicitly
    assert not base.exists(), "the guard must run before anything is written"


@pytest.mark.invariant(8)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_ephemeral_allowed_explicitly(scratch_dirs: dict[str, Path], kind: str, how: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "environment":
        monkeypatch.setenv("CHATSTATE_ALLOW_EPHEMERAL", "1")
    else:
        monkeypatch.delenv("CHATSTATE_ALLOW_EPHEMERAL", raising=False)
    for base in scratch_dirs.values():
        store = open_store(_url(kind, base), allow_ephemeral=how == "argument")
        try:
            assert store.guard_report.verdict == "ephemeral"
            _assert_sentences(store.guard_report.reasons)
            msgs = new_conversation(store, "c1", 2)
            assert store.load("c1").messages == msgs
            assert store.opens()[-1]["verdict"] == "ephemeral"
        finally:
            store.close()


@pytest.mark.invariant(8)
def test_env_override_needs_a_truthy_value(scratch_dirs: dict[str, Path],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATSTATE_ALLOW_EPHEMERAL", "0")
    with pytest.raises(EphemeralStoreError):
        open_store(_url("json", scratch_dirs["shm"]))


def test_checkout_disk_is_durable(tmp_path: Path) -> None:
    report = inspect(tmp_path)
    assert report.verdict == "durable", report.reasons
    assert report.fstype in durability.DURABLE_FSTYPES
    assert report.mount_point
    assert report.device
    assert report.free_bytes
    assert report.probe is not None
    assert report.probe.startswith("ok")
    _assert_sentences(report.reasons)
    assert str(tmp_path) in report.reasons[0]
    assert list(tmp_path.iterdir()) == []  # the probe cleaned up after itself
    for kind in ("json", "sqlite"):
        store = open_store(_url(kind, tmp_path / kind))
        assert store.guard_report.verdict == "durable"
        store.close()


@pytest.mark.parametrize("where", ["shm", "tmp"])
def test_ephemeral_reports_read_as_sentences(scratch_dirs: dict[str, Path], where: str) -> None:
    base = scratch_dirs[where]
    base.mkdir()
    report = inspect(base)
    assert report.verdict == "ephemeral"
    _assert_sentences(report.reasons)
    assert str(base) in report.reasons[0]
    assert report.probe is not None
    assert report.probe.startswith("ok")
    if where == "shm":
        assert report.fstype == "tmpfs"


@pytest.mark.invariant(8)
def test_nonexistent_path_skips_the_probe_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "deeper"
    report = inspect(target)
    assert report.path == str(target)
    assert report.probe is not None
    assert report.probe.startswith("skipped")
    assert report.verdict == "durable"  # judged by its nearest existing ancestor
    assert list(tmp_path.iterdir()) == []
    _assert_sentences(report.reasons)
    assert inspect(target, probe=False).probe is None


# -- a fake mount table ------------------------------------------------------------------------


def _fake_mountinfo(tmp_path: Path) -> Path:
    lines = [
        "21 1 0:50 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u",
        f"22 21 8:1 /volumes/data {tmp_path}/vol rw,relatime shared:2 - ext4 /dev/sda1 rw",
        "23 21 0:60 / /dev/shm rw,nosuid - tmpfs shm rw,size=65536k",
        "24 21 8:17 / /mnt/my\\040disk rw - xfs /dev/sdb1 rw",
        f"25 21 0:61 / {tmp_path}/nfs rw - nfs4 server:/export rw,vers=4.2",
        f"26 21 0:62 / {tmp_path}/odd rw - fuse.oddfs oddfs rw",
        f"27 21 8:33 / {tmp_path}/over rw - ext4 /dev/sdc1 rw",
        f"28 27 0:63 / {tmp_path}/over rw - tmpfs tmpfs rw",
        "not a mountinfo line",
    ]
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_mounts_and_mount_for_on_a_fake_table(tmp_path: Path) -> None:
    mounts = read_mounts(str(_fake_mountinfo(tmp_path)))
    assert mounts is not None
    assert len(mounts) == 8
    cases = {
        "/": ("/", "overlay"),
        "/app/data": ("/", "overlay"),
        "/dev/shm/x": ("/dev/shm", "tmpfs"),
        "/dev/shmx": ("/", "overlay"),  # a prefix of a name is not a parent directory
        "/mnt/my disk/file": ("/mnt/my disk", "xfs"),
        f"{tmp_path}/vol": (f"{tmp_path}/vol", "ext4"),
        f"{tmp_path}/vol/deep/er": (f"{tmp_path}/vol", "ext4"),
        f"{tmp_path}/volume": ("/", "overlay"),
        f"{tmp_path}/over/x": (f"{tmp_path}/over", "tmpfs"),  # the later mount on top wins
    }
    for path, (mount_point, fstype) in cases.items():
        m = mount_for(path, mounts)
        assert m is not None, path
        assert (m.mount_point, m.fstype) == (mount_point, fstype), path
    assert read_mounts(str(tmp_path / "absent")) is None


@pytest.mark.invariant(8)
def test_verdicts_from_a_fake_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = read_mounts(str(_fake_mountinfo(tmp_path)))
    monkeypatch.setattr(durability, "read_mounts", lambda *_a, **_k: mounts)
    for sub in ("vol", "nfs", "odd", "over", "rootfs"):
        (tmp_path / sub).mkdir()
    expect = {"vol": "durable", "nfs": "durable", "odd": "unknown", "over": "ephemeral",
              "rootfs": "ephemeral"}
    for sub, verdict in expect.items():
        report = inspect(tmp_path / sub, probe=False)
        assert report.verdict == verdict, (sub, report.reasons)
        _assert_sentences(report.reasons)
        assert any("overlay" in hint for hint in report.container_hints)
    assert inspect(tmp_path / "nfs", probe=False).network_fs
    assert "writable layer" in inspect(tmp_path / "rootfs", probe=False).reasons[0]
    assert "mounted volume" in " ".join(inspect(tmp_path / "vol", probe=False).reasons)
    monkeypatch.setattr(durability, "read_mounts", lambda *_a, **_k: None)  # no /proc (macOS)
    report = inspect(tmp_path / "vol", probe=False)
    assert report.verdict == "unknown"
    assert "mount table" in report.reasons[0]
    _assert_sentences(report.reasons)
