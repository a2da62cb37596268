"""Load driver (project venv), one JSON line out.

    python bench/drv_load.py prepare URL... --sizes 1000,10000 --prefix load
    python bench/drv_load.py load URL CID
    python bench/drv_load.py floor URL CID

``prepare`` seals one chain of ~500-byte messages and stores its first n
messages as conversation ``<prefix>-<n>`` in every store given. ``load`` runs
in a fresh process per measurement: it opens the store (untimed), then times
``store.load`` - which parses every message and verifies the whole hash chain
- and reports its wall and CPU (user + sys) seconds and peak RSS (VmHWM, else
getrusage maxrss) before and after. ``floor`` times, in a fresh process too, the
bare work no load can skip, with nothing of chatstate: for sqlite a plain
``SELECT CAST(body AS BLOB), hash`` of the conversation's rows (fetchall, the file
memory-mapped as the store's load maps it) and one sha256 per body; for json the
file read, one ``orjson.loads`` of it and one sha256 per line. The load's ratio to
it, taken in the same run, says what the machine's load does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from pathlib import Path

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


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load(url: str, cid: str) -> dict[str, object]:
    from chatstate import open_store

    store = open_store(url)
    before = peak_rss_kb()
    c0, t0 = cpu_seconds(), time.perf_counter()
    conv = store.load(cid)
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    after = peak_rss_kb()
    return {"seconds": elapsed, "cpu": cpu, "messages": len(conv.messages),
            "maxrss_before_kb": before, "maxrss_after_kb": after}


def floor(url: str, cid: str) -> dict[str, object]:
    """``load``'s floor (see the module docstring): wall and CPU seconds."""
    import sqlite3

    import orjson

    scheme, _, rest = url.partition("://")
    sha = hashlib.sha256
    c0, t0 = cpu_seconds(), time.perf_counter()
    if scheme == "sqlite":
        db = sqlite3.connect(rest)
        db.execute(f"PRAGMA mmap_size={1 << 30}")
        rows = db.execute("SELECT CAST(body AS BLOB), hash FROM messages WHERE "
                          "conversation_id=? ORDER BY seq", (cid,)).fetchall()
        for body, _hash in rows:
            sha(body).hexdigest()
        count = len(rows)
    else:
        raw = (Path(rest) / f"{cid}.json").read_bytes()
        count = len(orjson.loads(raw)["messages"])
        for line in raw.split(b"\n"):
            sha(line).hexdigest()
    return {"seconds": time.perf_counter() - t0, "cpu": cpu_seconds() - c0,
            "messages": count}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("urls", nargs="+")
    p.add_argument("--sizes", required=True)
    p.add_argument("--prefix", default="load")
    for name in ("load", "floor"):
        q = sub.add_parser(name)
        q.add_argument("url")
        q.add_argument("cid")
    args = parser.parse_args()
    if args.cmd == "prepare":
        result = prepare(args.urls, [int(s) for s in args.sizes.split(",")], args.prefix)
    else:
        result = (load if args.cmd == "load" else floor)(args.url, args.cid)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
