"""Slow-disk streaming driver (project venv): ``Chat.stream`` timed per store.

    python bench/drv_slowdisk.py FAKE_BASE_URL REPS KIND=URL...

Run once as is and once under strace with every fsync/fdatasync delayed; the
orchestrator (s_slowdisk.py) compares the two. Each repetition streams one
reply per store (rotating order) into a fresh conversation created untimed; the
time runs from ``chat.stream(text)`` (the user message is persisted first) to
the committed reply. Prints one JSON object: store -> {"total": [s...],
"deltas": [n...]}, plus "stream alone" (the adapter, no store).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator

MODEL = "fake-model"


def main() -> None:
    from chatstate import Chat, make_adapter, open_store

    base_url, reps = sys.argv[1], int(sys.argv[2])
    adapter = make_adapter(base_url=base_url, api_key="x", model=MODEL)
    def alone() -> Callable[[], Iterator[str]]:
        return lambda: (e for e in adapter.stream([{"role": "user", "content": "hi"}],
                                                  model=MODEL) if isinstance(e, str))

    runs: dict[str, Callable[[], Callable[[], Iterator[str]]]] = {"stream alone": alone}
    for spec in sys.argv[3:]:
        kind, url = spec.split("=", 1)
        store = open_store(url)

        def prepare(store: object = store) -> Callable[[], Iterator[str]]:
            chat = Chat(store, adapter=adapter, conversation_id=f"s-{uuid.uuid4().hex[:12]}",
                        model=MODEL)
            chat.set_title("bench")
            return lambda: chat.stream("hi")

        runs[kind] = prepare
    names = list(runs)
    out: dict[str, dict[str, list[float]]] = {n: {"total": [], "deltas": []} for n in names}
    for rep in range(reps + 1):  # the first repetition warms up and is dropped
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = runs[name]()
            t0 = time.perf_counter()
            count = sum(1 for _ in start())
            total = time.perf_counter() - t0
            if rep:
                out[name]["total"].append(total)
                out[name]["deltas"].append(count)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
