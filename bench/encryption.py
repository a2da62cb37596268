"""What encryption at rest costs: append latency and load time, encrypted vs plain.

    .venv/bin/python bench/encryption.py [--messages 100000] [--appends 200] [--kinds sqlite,json]

For each local store kind, a plain store and an encrypted one (a fresh key) in a
scratch directory under bench/work: ``--appends`` single-message appends after a
create (each durable: fsync'd / committed; the median and mean are reported), then
one conversation of ``--messages`` ~500-byte messages, loaded three times by a fresh
store object (the best is reported; a load parses and verifies every message, and
the encrypted one checks every tag and both chains). Prints one JSON line per kind
with the ratios encrypted / plain (targets: append <= 1.15x, load <= 1.5x); the load's
CPU time too (``load_cpu_ratio``: steadier than the wall clock on a busy machine), and
how much a load grows a fresh process's peak resident memory (``load_peak_mb``, one
load each in a process of its own; the key goes over a pipe).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _drvproto import text

WORK = Path(__file__).resolve().parent / "work" / "encryption"


def url_of(kind: str, root: Path) -> str:
    return f"sqlite://{root}/s.db" if kind == "sqlite" else f"json://{root}/store"


def measure(kind: str, key: str, messages: int, appends: int) -> dict[str, object]:
    """Plain and encrypted side by side, interleaved (each append and each load of one
    is followed by the same of the other), so a busy machine slows both alike."""
    from chatstate import Conversation, Message, open_store
    from chatstate.stores.codec import parse_key

    keys = {"plain": None, "encrypted": parse_key(key, "bench")}
    urls = {}
    for name in keys:
        root = WORK / f"{kind}-{name}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        urls[name] = url_of(kind, root)
    stores = {name: open_store(urls[name], key=keys[name]) for name in keys}
    for store in stores.values():
        store.create(Conversation(id="a", title="append"))
    prev: Message | None = None
    took: dict[str, list[float]] = {name: [] for name in keys}
    for i in range(appends):
        prev = Message.seal(prev, role="user" if i % 2 == 0 else "assistant",
                            content=text(i), turn_id=f"t-{i // 2}")
        for name, store in stores.items():
            t0 = time.perf_counter()
            store.append("a", [prev])
            took[name].append(time.perf_counter() - t0)
    chain: list[Message] = []
    for i in range(messages):
        chain.append(Message.seal(chain[-1] if chain else None,
                                  role="user" if i % 2 == 0 else "assistant",
                                  content=text(i), turn_id=f"t-{i // 2}"))
    for store in stores.values():
        store.create(Conversation(id="big", title="load"))
        for start in range(0, messages, 5000):
            store.append("big", chain[start:start + 5000])
        store.close()
    loads: dict[str, list[float]] = {name: [] for name in keys}
    cpu: dict[str, list[float]] = {name: [] for name in keys}
    for _ in range(3):
        for name in keys:
            fresh = open_store(urls[name], key=keys[name])
            t0, c0 = time.perf_counter(), time.process_time()
            loaded = fresh.load("big")
            loads[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            assert len(loaded.messages) == messages
            assert loaded.messages[-1].hash == chain[-1].hash
            fresh.close()
    peaks = {name: peak_growth(urls[name], key if keys[name] else "") for name in keys}
    for name in keys:
        shutil.rmtree(WORK / f"{kind}-{name}", ignore_errors=True)
    out: dict[str, object] = {"kind": kind, "messages": messages, "appends": appends}
    for name in keys:
        out[name] = {"append_median_ms": round(statistics.median(took[name]) * 1000, 3),
                     "append_mean_ms": round(statistics.fmean(took[name]) * 1000, 3),
                     "load_s": round(min(loads[name]), 3),
                     "load_cpu_s": round(min(cpu[name]), 3),
                     "load_peak_mb": peaks[name]}
    plain, sealed = (statistics.median(took[n]) for n in keys)
    out["append_ratio_median"] = round(sealed / plain, 3)
    out["append_ratio_mean"] = round(statistics.fmean(took["encrypted"]) /
                                     statistics.fmean(took["plain"]), 3)
    out["load_ratio"] = round(min(loads["encrypted"]) / min(loads["plain"]), 3)
    out["load_cpu_ratio"] = round(min(cpu["encrypted"]) / min(cpu["plain"]), 3)
    return out


_PEAK = """
import sys
from chatstate import open_store
from chatstate.stores.codec import parse_key

def status(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field))

key = sys.stdin.read()
store = open_store(sys.argv[1], key=parse_key(key, "bench") if key else None)
before = status("VmRSS:")
store.load("big")
print((status("VmHWM:") - before) // 1024)
"""


def peak_growth(url: str, key: str) -> int:
    """MB a load of "big" takes at its peak over the resident memory a fresh process had
    before it (the imports done): the high-water mark after, less the RSS before."""
    done = subprocess.run([sys.executable, "-c", _PEAK, url], input=key, text=True,
                          capture_output=True, check=True)
    return int(done.stdout)


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
        print(json.dumps(measure(kind, key, args.messages, args.appends)), flush=True)


if __name__ == "__main__":
    main()
