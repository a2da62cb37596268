"""Take a conversation's writer lease in its own process, say so, and hold it until killed.

    lease_holder.py URL CID TERM [HOST]

HOST stands in for another machine's hostname (a dead pid there is not knowable).
"""

from __future__ import annotations

import sys
import time

from chatstate.stores import open_store
from chatstate.stores.leases import Lease, take


def main(url: str, cid: str, term: float, host: str | None = None) -> None:
    store = open_store(url)
    lease = Lease(cid, term)
    if host:
        lease.host = host
    take(store.url, store._try_lease, lease, 0)
    print(f"held {lease.pid}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), *sys.argv[4:5])
