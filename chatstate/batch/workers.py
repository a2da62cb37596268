"""Who holds a ledger row, and whether that process is still alive.

A worker is one ``Batch.run`` in one process, named by host, pid and the
process's start time (plus a random suffix, so two runs in one process differ).
The start time guards against pid reuse: a pid that now belongs to another
process is a dead worker. A worker on another host cannot be checked from here,
so it counts as alive: stealing a live worker's rows would call the model twice.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Literal

from chatstate.durable.guard import boot_id

Liveness = Literal["alive", "dead", "elsewhere"]


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), or None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent: dead
        return None
    try:
        return int(fields[19])  # field 22 of proc(5)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Worker:
    id: str
    host: str
    pid: int
    boot_id: str | None
    start_ticks: int | None

    @classmethod
    def current(cls, host: str | None = None) -> Worker:
        """This process; ``host`` names the host in a shared ledger (default: the hostname)."""
        host, pid = host or socket.gethostname(), os.getpid()
        ticks = start_ticks(pid)
        wid = f"{host}:{pid}:{ticks if ticks is not None else '?'}:{secrets.token_hex(3)}"
        return cls(id=wid, host=host, pid=pid, boot_id=boot_id(), start_ticks=ticks)


def liveness(host: str, pid: int, boot: str | None, ticks: int | None,
             ended: bool, here: str | None = None) -> Liveness:
    """Is the worker that registered with these facts still running? ``here``: the name
    this host goes by in the ledger (``--host-id``), besides its hostname: a worker that
    registered under it is this host's, and its process can be checked."""
    if ended:
        return "dead"
    if host != socket.gethostname() and host != here:
        return "elsewhere"
    now_boot = boot_id()
    if boot and now_boot and boot != now_boot:
        return "dead"  # registered before the last reboot
    if os.path.isdir("/proc/self"):
        current = start_ticks(pid)
        if current is None:
            return "dead"
        return "alive" if ticks is None or current == ticks else "dead"
    try:  # no /proc (macOS): the pid alone, without a pid-reuse check
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        return "alive"
    return "alive"
