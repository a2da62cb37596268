"""What the s3 store checks of the server itself: conditional writes, and its clock.

The store's compare-and-append is a create-only PUT (``If-None-Match: *``) and its
replacements are ``If-Match`` PUTs. A server (or a proxy in front of it) that
ignores those headers accepts both writers of a race, silently. ``probe`` proves
the server refuses them, on a throwaway object under ``_probe/``: a create-only
PUT twice (the second must be refused) and a PUT with a wrong ``If-Match`` (must be
refused). ``ensure`` runs it once per process per endpoint and bucket, at open;
``check()`` (so ``chatstate doctor``) runs it every time.

The same probe object's ``Last-Modified`` is the server's clock at that moment:
``ServerClock`` keeps it with this host's boot-time clock (which steps with
neither wall-clock changes nor suspend), so lease expiry can be judged on the
server's time (``_lease``) with no extra request per decision. ``Last-Modified``
has whole seconds, so the clock says a lower bound and how unsure it is.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatstate.errors import ChatstateError, StoreUnavailable
from chatstate.stores.s3._doc import PROBES

if TYPE_CHECKING:
    from chatstate.stores.s3._transport import S3IO

REANCHOR = 600.0
"""Seconds after which the server clock is read again, at the next lease decision."""


def _ticks() -> float:
    """Seconds on a clock that never steps and counts suspend (Linux boot time)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


@dataclass(frozen=True)
class ServerClock:
    """The server's time as a lower bound: ``now() <= true server time <= now() + slack``."""

    seen: float
    """The server's clock (epoch seconds) at a write, from its whole-second Last-Modified."""
    after: float
    """``_ticks()`` when the write's answer arrived (the write happened before that)."""
    slack: float
    """How far ``now()`` may lag: the second Last-Modified drops, plus the round trip."""

    def now(self) -> float:
        return self.seen + (_ticks() - self.after)

    @property
    def age(self) -> float:
        return _ticks() - self.after


_lock = threading.Lock()
_checked: dict[tuple[str, str], ServerClock] = {}


def _refused(io: S3IO, what: str) -> StoreUnavailable:
    endpoint = io.target.endpoint_shown
    return StoreUnavailable(
        f"refusing S3 server {endpoint} (bucket {io.target.bucket}): it does not honour "
        f"{what}, so two writers could both win one seq; nothing was stored. Use a server "
        "with conditional writes (AWS S3, MinIO, R2, SeaweedFS), or remove the proxy that "
        "drops these headers.")


def probe(io: S3IO) -> ServerClock:
    """Prove the server honours If-None-Match: * and If-Match, and read its clock.

    Raises StoreUnavailable in one line naming the server and the missing feature.
    """
    from chatstate.stores.s3._transport import Exists, Stale

    key = f"{PROBES}/cond-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    body = b"chatstate conditional-write probe"
    try:
        sent = _ticks()
        etag = io.put(key, body, create=True, action="write a probe to")
        after = _ticks()
        try:
            io.put(key, body + b" again", create=True, action="write a probe to")
        except Exists:
            pass
        else:
            raise _refused(io, "If-None-Match: * (a second create-only PUT of one key was "
                           "accepted)")
        wrong = '"0123456789abcdef0123456789abcdef"' if etag != \
            '"0123456789abcdef0123456789abcdef"' else '"fedcba9876543210fedcba9876543210"'
        try:
            io.put(key, body + b" replaced", etag=wrong, action="write a probe to")
        except Stale:
            pass
        else:
            raise _refused(io, "If-Match (a PUT with a wrong e-tag was accepted)")
        modified = io.modified(key, "read the probe back from")
    except BaseException:
        with suppress(ChatstateError):  # the refusal (or first failure) is what is said
            io.delete([key], "delete the probe")
        raise
    io.delete([key], "delete the probe")
    return ServerClock(seen=modified.timestamp(), after=after, slack=1.0 + (after - sent))


def ensure(io: S3IO) -> ServerClock:
    """``probe`` once per process per endpoint and bucket; its clock afterwards."""
    key = (io.target.endpoint_shown, io.target.bucket)
    with _lock:
        known = _checked.get(key)
    if known is not None:
        return known
    clock = probe(io)
    with _lock:
        _checked[key] = clock
    return clock


def recheck(io: S3IO) -> ServerClock:
    """``probe`` again now (``check()``, so ``doctor``), and keep its clock."""
    clock = probe(io)
    with _lock:
        _checked[(io.target.endpoint_shown, io.target.bucket)] = clock
    return clock


def server_clock(io: S3IO) -> ServerClock:
    """The server's clock; read again (one probe) when the reading is old."""
    clock = ensure(io)
    return recheck(io) if clock.age > REANCHOR else clock


def forget() -> None:
    """Forget every server checked (tests that put another server behind one endpoint)."""
    with _lock:
        _checked.clear()
