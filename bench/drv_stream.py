"""Streaming driver (project venv): one streamed reply, timed, per system and repetition.

    python bench/drv_stream.py FAKE_BASE_URL REPS KIND=URL...

Systems: the bare openai SDK (no persistence), chatstate's adapter alone (no
store), and ``Chat.stream`` on each store given. Each repetition runs every
system once, in an order that rotates. Times are from the call that starts
the turn to the first delta handed to the caller, and to the end of the
stream. Prints one JSON object: system -> {"first": [s...], "total": [s...],
"deltas": [n...]}.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

PROMPT = "hi"
MODEL = "fake-model"
MESSAGES = [{"role": "user", "content": PROMPT}]


Start = Callable[[], Iterator[str]]


def sdk_stream(base_url: str) -> Callable[[], Start]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)

    def start() -> Iterator[str]:
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES,  # type: ignore
                                                stream=True)
        return (c.choices[0].delta.content for c in stream
                if c.choices and c.choices[0].delta.content)

    return lambda: start


def adapter_stream(adapter: Any) -> Callable[[], Start]:
    def start() -> Iterator[str]:
        return (e for e in adapter.stream(MESSAGES, model=MODEL) if isinstance(e, str))

    return lambda: start


def chat_stream(adapter: Any, url: str) -> Callable[[], Start]:
    """A fresh conversation per run, created and titled untimed, so the timed turn is an
    ordinary turn: persist the user message, stream with a durable partial per delta,
    commit the reply."""
    from chatstate import Chat, open_store

    store = open_store(url)

    def prepare() -> Start:
        chat = Chat(store, adapter=adapter, conversation_id=f"s-{uuid.uuid4().hex[:12]}",
                    model=MODEL)
        chat.set_title("bench")
        return lambda: chat.stream(PROMPT)

    return prepare


def timed(prepare: Callable[[], Start]) -> tuple[float, float, int]:
    start = prepare()
    first, count = None, 0
    t0 = time.perf_counter()
    for _ in start():
        if first is None:
            first = time.perf_counter()
        count += 1
    end = time.perf_counter()
    assert first is not None
    return first - t0, end - t0, count


def main() -> None:
    from chatstate import make_adapter

    base_url, reps = sys.argv[1], int(sys.argv[2])
    adapter = make_adapter(base_url=base_url, api_key="x", model=MODEL)
    systems: dict[str, Callable[[], Start]] = {
        "openai SDK, no persistence": sdk_stream(base_url),
        "chatstate adapter, no store": adapter_stream(adapter)}
    for spec in sys.argv[3:]:
        kind, url = spec.split("=", 1)
        systems[f"chatstate-{kind} Chat.stream"] = chat_stream(adapter, url)
    names = list(systems)
    for name in names:  # warm-up: connections, imports, first writes
        timed(systems[name])
    out: dict[str, dict[str, list[float]]] = {n: {"first": [], "total": [], "deltas": []}
                                              for n in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            first, total, count = timed(systems[name])
            out[name]["first"].append(first)
            out[name]["total"].append(total)
            out[name]["deltas"].append(count)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
