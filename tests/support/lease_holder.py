"""Take a conversation's writer lease in its own process, say so, and hold it until killed.

    lease_holder.py URL CID TERM [HOST] [--skew SECONDS] [--renew]

HOST stands in for another machine: its hostname (a dead pid there is not knowable)
and its boot id. ``--skew`` sets this process's wall clock SECONDS ahead (behind when
negative) through the lease code's clock seam; ``--renew`` keeps the lease renewed the
way a turn does (``session.writer_lease.Held``) instead of taking it once: SIGSTOP the
process to make a live holder that stopped renewing.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from chatstate.session.writer_lease import Held
from chatstate.stores import leases, open_store
from chatstate.stores.leases import Lease, take


def main(url: str, cid: str, term: float, host: str | None = None, *, skew: float = 0.0,
         renew: bool = False) -> None:
    if skew:
        leases.wall_clock = lambda: time.time() + skew
    store = open_store(url)
    lease = Lease(cid, term)
    if host:
        lease.host = host
        lease.boot = f"boot-of-{host}"
    take(store.url, store._try_lease, lease, 0)
    if renew:
        Held(store, lease)
    print(f"held {lease.pid}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    args = sys.argv[1:]
    flags: dict[str, Any] = {"renew": "--renew" in args}
    if "--renew" in args:
        args.remove("--renew")
    if "--skew" in args:
        at = args.index("--skew")
        flags["skew"] = float(args[at + 1])
        del args[at:at + 2]
    main(args[0], args[1], float(args[2]), *args[3:4], **flags)
