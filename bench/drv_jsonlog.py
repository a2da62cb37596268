"""Driver for scenario 8: one-message appends through the json Store API, interleaved
with the jsonl+fsync floor, at one transcript length. Prints one JSON object.

    drv_jsonlog.py WORKDIR N K  ->  {"json": [seconds...], "floor": [seconds...]}
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store


def main(work: Path, n: int, k: int) -> None:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    url = f"json://{work / 'json'}"
    store = open_store(url)
    store.create(Conversation(id="c"))
    prev: Message | None = None
    batch = []
    for i in range(n):  # the prefill: untimed, one append, then compacted by close
        prev = Message.seal(prev, role="user" if i % 2 == 0 else "assistant",
                            content="x" * 500, turn_id=f"t{i // 2}")
        batch.append(prev)
    if batch:
        store.append("c", batch)
    store.close()
    store = open_store(url)
    store.load("c")
    fd = os.open(work / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = b'{"role":"user","content":"' + b"y" * 500 + b'"}\n'
    out: dict[str, list[float]] = {"json": [], "floor": []}
    for i in range(k):
        prev = Message.seal(prev, role="user", content="y" * 500, turn_id=f"u{i}")
        pair = [("json", lambda m=prev: store.append("c", [m])),
                ("floor", lambda: (os.write(fd, line), os.fsync(fd)))]
        for name, call in (pair if i % 2 == 0 else pair[::-1]):
            t0 = time.perf_counter()
            call()
            out[name].append(time.perf_counter() - t0)
    os.close(fd)
    store.close()
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
