"""The durability guard: where do these bytes physically land, and will they survive a restart?

``inspect(path)`` reads the mount table (/proc/self/mountinfo), the device ids of
the path and of /tmp, container hints and free space, and writes, fsyncs and
reads back a probe file. The verdict is ``durable``, ``ephemeral`` or
``unknown``, with the reasons in sentences.

Sharing /tmp's device is shown as a reason but is not a verdict on its own:
on many hosts /tmp is a plain directory on the root disk. What *is* ephemeral:
tmpfs and ramfs, paths under /tmp, /var/tmp, /dev/shm and /run, and a
container's overlay writable layer.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Verdict = Literal["durable", "ephemeral", "unknown"]

EPHEMERAL_FSTYPES = {"tmpfs", "ramfs", "devtmpfs", "overlay", "aufs", "zram"}
DURABLE_FSTYPES = {
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs",
    "apfs", "hfs", "hfsplus", "ntfs", "ntfs3", "vfat", "exfat", "nfs", "nfs4", "cifs", "smb3",
    "9p", "virtiofs", "ceph", "glusterfs", "lustre", "gpfs",
}
NETWORK_FSTYPES = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "sshfs", "fuse.sshfs", "9p",
                   "ceph", "glusterfs", "fuse.glusterfs", "lustre", "afs"}
EPHEMERAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run")
PREFIX_WHY = {
    "/tmp": "which is cleared on reboot on most systems.",
    "/var/tmp": "which survives a reboot but is a temporary directory: systemd-tmpfiles "
                "(or tmpreaper) deletes files there that are not used for some days.",
    "/dev/shm": "which lives in memory and is lost on reboot.",
    "/run": "which lives in memory and is lost on reboot.",
}
MOUNTINFO = "/proc/self/mountinfo"


@dataclass
class Mount:
    mount_point: str
    fstype: str
    source: str
    options: str


@dataclass
class Report:
    """What ``inspect`` found for one path."""

    path: str
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    mount_point: str | None = None
    fstype: str | None = None
    source: str | None = None
    device: str | None = None
    shares_tmp_device: bool | None = None
    network_fs: bool = False
    container_hints: list[str] = field(default_factory=list)
    free_bytes: int | None = None
    boot_id: str | None = None
    probe: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def one_line(self) -> str:
        where = f"{self.fstype or '?'} {self.source or '?'}"
        return f"on {where}: {self.verdict}"


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def host_identity() -> dict[str, str | None]:
    """Boot id, hostname and DEPLOY_ID: what a store records on every open."""
    return {"boot_id": boot_id(), "hostname": socket.gethostname(),
            "deploy_id": os.environ.get("DEPLOY_ID")}


def _unescape(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal
    return (field_.replace("\\040", " ").replace("\\011", "\t")
            .replace("\\012", "\n").replace("\\134", "\\"))


def read_mounts(mountinfo: str = MOUNTINFO) -> list[Mount] | None:
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return None
    mounts = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 6 or len(rparts) < 2:
            continue
        mounts.append(Mount(mount_point=_unescape(parts[4]), fstype=rparts[0],
                            source=_unescape(rparts[1]), options=parts[5]))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the last-mounted longest prefix wins (over-mounts)."""
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if (path == mp or path.startswith(mp.rstrip("/") + "/") or mp == "/") and (
                best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/")):
            best = m
    return best


def existing_ancestor(path: Path) -> Path:
    p = path
    while not os.path.exists(p) and p != p.parent:  # False, not an error, on EACCES
        p = p.parent
    return p


def container_hints() -> list[str]:
    hints = []
    if os.path.exists("/.dockerenv"):
        hints.append("/.dockerenv exists (Docker container)")
    if os.path.exists("/run/.containerenv"):
        hints.append("/run/.containerenv exists (Podman container)")
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        hints.append("KUBERNETES_SERVICE_HOST is set (Kubernetes pod)")
    mounts = read_mounts() or []
    root = mount_for("/", mounts)
    if root is not None and root.fstype in ("overlay", "aufs"):
        hints.append(f"the root filesystem is {root.fstype} (a container image layer)")
    return hints


def write_probe(directory: Path) -> str:
    """Write, fsync and read back a small file in ``directory``; say what happened."""
    probe = directory / f".chatstate-probe-{secrets.token_hex(6)}"
    payload = secrets.token_bytes(32)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        ok = probe.read_bytes() == payload
        return "ok: wrote, fsynced and read back a probe" if ok else "failed: read back differs"
    except OSError as exc:
        return f"failed: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def _path_rule(real: str) -> str | None:
    for prefix in EPHEMERAL_PREFIXES:
        if real == prefix or real.startswith(prefix + "/"):
            return f"The path {real} is under {prefix}, {PREFIX_WHY[prefix]}"
    return None


def inspect(path: str | os.PathLike[str], *, probe: bool = True) -> Report:
    """Where would a store at ``path`` keep its bytes, and will they survive a restart?

    ``path`` need not exist yet: the nearest existing ancestor is inspected and
    the probe is skipped (chatstate writes nowhere it was not asked to).
    """
    target = Path(path).expanduser().absolute()
    anchor = existing_ancestor(target)
    real = os.path.realpath(anchor)
    rep = Report(path=str(target), verdict="unknown", boot_id=boot_id(),
                 container_hints=container_hints())
    ephemeral: list[str] = []
    rule = _path_rule(real)
    if rule:
        ephemeral.append(rule)
    try:
        st = os.stat(anchor)
        rep.device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        rep.shares_tmp_device = os.path.isdir("/tmp") and os.stat("/tmp").st_dev == st.st_dev
        rep.free_bytes = shutil.disk_usage(anchor).free
    except OSError as exc:
        rep.reasons.append(f"Could not stat {anchor}: {exc.strerror}.")
    mounts = read_mounts()
    mount = mount_for(real, mounts) if mounts else None
    if mount is not None:
        rep.mount_point, rep.fstype, rep.source = mount.mount_point, mount.fstype, mount.source
        rep.network_fs = mount.fstype in NETWORK_FSTYPES
        if mount.fstype in ("overlay", "aufs"):
            ephemeral.append(f"The path {real} is on an {mount.fstype} filesystem at "
                             f"{mount.mount_point}: a container's writable layer, discarded "
                             "when the container is replaced.")
        elif mount.fstype in EPHEMERAL_FSTYPES:
            ephemeral[:] = []  # the same reason as a path rule, said once, with the filesystem
            ephemeral.append(f"The path {real} is on {mount.fstype} ({mount.mount_point}), "
                             "which lives in memory and is lost on reboot.")
    if rep.shares_tmp_device:
        rep.reasons.append("It shares a device with /tmp (common when /tmp is a directory on "
                           "the root disk; not ephemeral by itself).")
    if rep.container_hints and not ephemeral:
        rep.reasons.append("Running in a container (" + "; ".join(rep.container_hints) + "); "
                           "this path is on a mounted volume, not the image layer.")
    if probe:
        probe_dir = target if os.path.isdir(target) else target.parent
        rep.probe = (write_probe(probe_dir) if os.path.isdir(probe_dir)
                     else "skipped: the directory does not exist yet")
    if ephemeral:
        rep.verdict = "ephemeral"
        rep.reasons = ephemeral + rep.reasons
    elif mount is None:
        rep.reasons.insert(0, "The mount table is not available here, so only path rules were "
                              "applied; the filesystem could not be identified.")
    elif mount.fstype in DURABLE_FSTYPES:
        rep.verdict = "durable"
        rep.reasons.insert(0, f"The path {real} is on {mount.fstype} ({mount.source} at "
                              f"{mount.mount_point}), a disk-backed filesystem.")
    else:
        rep.reasons.insert(0, f"The path {real} is on {mount.fstype} ({mount.source}), which "
                              "chatstate does not know to be durable or not.")
    if rep.probe and rep.probe.startswith("failed"):
        rep.reasons.append(f"The write probe {rep.probe}.")
    return rep
