"""Load driver (project venv), one JSON line out.

    python bench/drv_load.py prepare URL... --sizes 1000,10000 --prefix load
    python bench/drv_load.py load URL CID

``prepare`` seals one chain of ~500-byte messages and stores its first n
messages as conversation ``<prefix>-<n>`` in every store given. ``load`` runs
in a fresh process per measurement: it opens the store (untimed), then times
``store.load`` - which parses every message and verifies the whole hash chain
- and reports peak RSS (VmHWM, else getrusage maxrss) before and after.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from _drvproto import text


def prepare(urls: list[str], sizes: list[int], prefix: str) -> dict[str, object]:
    from chatstate import Conversation, Message, open_store

    chain: list[Message] = []
    for i in range(max(sizes)):
        chain.append(Message.seal(chain[-1] if chain else None,
                                  role="user" if i % 2 == 0 else "assistant",
                                  content=text(i), turn_id=f"t-{i // 2:016x}"))
    out = {}
    for url in urls:
        store = open_store(url)
        for n in sizes:
            cid = f"{prefix}-{n}"
            t0 = time.perf_counter()
            store.create(Conversation(id=cid, title=f"bench {n}"))
            store.append(cid, chain[:n])
            out[f"{url} {n}"] = time.perf_counter() - t0
        store.close()
    return out


def peak_rss_kb() -> int:
    """This process's own peak RSS. getrusage's maxrss is carried over an exec on Linux,
    so a driver started by a large orchestrator would report the orchestrator's peak;
    /proc's VmHWM belongs to this process's memory map alone."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def load(url: str, cid: str) -> dict[str, object]:
    from chatstate import open_store

    store = open_store(url)
    before = peak_rss_kb()
    t0 = time.perf_counter()
    conv = store.load(cid)
    elapsed = time.perf_counter() - t0
    after = peak_rss_kb()
    return {"seconds": elapsed, "messages": len(conv.messages), "maxrss_before_kb": before,
            "maxrss_after_kb": after}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("urls", nargs="+")
    p.add_argument("--sizes", required=True)
    p.add_argument("--prefix", default="load")
    q = sub.add_parser("load")
    q.add_argument("url")
    q.add_argument("cid")
    args = parser.parse_args()
    if args.cmd == "prepare":
        result = prepare(args.urls, [int(s) for s in args.sizes.split(",")], args.prefix)
    else:
        result = load(args.url, args.cid)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
