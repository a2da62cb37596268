"""What encryption at rest costs: append latency and load time, encrypted vs plain.

    .venv/bin/python bench/encryption.py [--messages 100000] [--appends 200] [--kinds sqlite,json]

For each local store kind, a plain store and an encrypted one (a fresh key) in a
scratch directory under bench/work: ``--appends`` single-message appends after a
create (each durable: fsync'd / committed; the median and mean are reported), then
one conversation of ``--messages`` ~500-byte messages, loaded three times by a fresh
store object (the best is reported; a load parses and verifies every message, and
the encrypted one checks every tag and both chains). Prints one JSON line per kind
with the ratios encrypted / plain (targets: append <= 1.15x, load <= 1.5x).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _drvproto import text

WORK = Path(__file__).resolve().parent / "work" / "encryption"


def url_of(kind: str, root: Path) -> str:
    return f"sqlite://{root}/s.db" if kind == "sqlite" else f"json://{root}/store"


def measure(kind: str, key: str | None, messages: int, appends: int) -> dict[str, float]:
    from chatstate import Conversation, Message, open_store
    from chatstate.stores.codec import parse_key

    root = WORK / f"{kind}-{'sealed' if key else 'plain'}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    raw_key = None if key is None else parse_key(key, "bench")
    url = url_of(kind, root)
    store = open_store(url, key=raw_key)
    store.create(Conversation(id="a", title="append"))
    prev: Message | None = None
    took = []
    for i in range(appends):
        prev = Message.seal(prev, role="user" if i % 2 == 0 else "assistant",
                            content=text(i), turn_id=f"t-{i // 2}")
        t0 = time.perf_counter()
        store.append("a", [prev])
        took.append(time.perf_counter() - t0)
    chain: list[Message] = []
    for i in range(messages):
        chain.append(Message.seal(chain[-1] if chain else None,
                                  role="user" if i % 2 == 0 else "assistant",
                                  content=text(i), turn_id=f"t-{i // 2}"))
    store.create(Conversation(id="big", title="load"))
    for start in range(0, messages, 5000):
        store.append("big", chain[start:start + 5000])
    store.close()
    loads = []
    for _ in range(3):
        fresh = open_store(url, key=raw_key)
        t0 = time.perf_counter()
        loaded = fresh.load("big")
        loads.append(time.perf_counter() - t0)
        assert len(loaded.messages) == messages and loaded.messages[-1].hash == chain[-1].hash
        fresh.close()
    shutil.rmtree(root, ignore_errors=True)
    return {"append_median_ms": statistics.median(took) * 1000,
            "append_mean_ms": statistics.fmean(took) * 1000, "load_s": min(loads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--kinds", default="sqlite,json")
    args = parser.parse_args()
    from chatstate.stores.codec import new_key

    os.environ.pop("CHATSTATE_ENCRYPTION_KEY", None)
    key = new_key()
    for kind in args.kinds.split(","):
        plain = measure(kind, None, args.messages, args.appends)
        sealed = measure(kind, key, args.messages, args.appends)
        print(json.dumps({
            "kind": kind, "messages": args.messages, "plain": plain, "encrypted": sealed,
            "append_ratio_median": round(sealed["append_median_ms"] /
                                         plain["append_median_ms"], 3),
            "append_ratio_mean": round(sealed["append_mean_ms"] / plain["append_mean_ms"], 3),
            "load_ratio": round(sealed["load_s"] / plain["load_s"], 3)}), flush=True)


if __name__ == "__main__":
    main()
