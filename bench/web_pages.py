"""How fast the web view renders on a big store: the list pages and a 10,000-message
conversation, over real HTTP to ``chatstate web`` on loopback.

    python bench/web_pages.py [--conversations 2000] [--messages 10000] [--runs 5]

The store (sqlite, under bench/work/web/) holds ``--conversations`` two-turn
conversations of two models and one of ``--messages`` messages; it is built once
and reused. Each page is fetched ``--runs`` times: the first fetch after start-up
(cold: the list works out the rows it shows from the messages) and the median of
the rest (warm) are reported, with the size of the HTML.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).parent))
from common import WORK, table
from serve_load import CHATSTATE, start

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store


def build(url: str, conversations: int, messages: int) -> None:
    store = open_store(url)
    try:
        for i in range(conversations):
            conv = Conversation(id=f"c{i:05d}", title=f"conversation {i}")
            store.create(conv)
            prev = None
            sealed = []
            for j, role in enumerate(("user", "assistant", "user", "assistant")):
                prev = Message.seal(prev, role=role, content=f"message {j} of {i}",
                                    turn_id=f"t{i}-{j // 2}",
                                    model=None if role == "user" else f"model-{i % 2}",
                                    usage=None if role == "user" else
                                    {"prompt_tokens": 20 + j, "completion_tokens": 9})
                sealed.append(prev)
            store.append(conv.id, sealed)
        big = Conversation(id="big", title="a 10,000-message conversation")
        store.create(big)
        prev, sealed = None, []
        for j in range(messages):
            role = "user" if j % 2 == 0 else "assistant"
            prev = Message.seal(prev, role=role, turn_id=f"b{j // 2}",
                                content=f"**message {j}** with `code` and a [link]"
                                        f"(https://example.invalid/{j})\n\n```python\n"
                                        f"x = {j}\n```",
                                model=None if role == "user" else "model-0",
                                usage=None if role == "user" else
                                {"prompt_tokens": j, "completion_tokens": 3})
            sealed.append(prev)
        store.append(big.id, sealed)
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    folder = WORK / "web" / f"{args.conversations}-{args.messages}"
    url = f"sqlite://{folder}/store.db"
    if not (folder / "store.db").exists():
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        build(url, args.conversations, args.messages)
        print(f"built {url} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    proc, root = start([CHATSTATE, "--store", url, "web", "--port", "0"],
                       r"web view on (http://\S+)/", dict(os.environ))
    pages = ["/", "/?page=2", f"/?page={max(1, args.conversations // 50)}",
             "/?model=model-1", "/c/big", f"/c/big?page={args.messages // 200}",
             "/c/c00001"]
    rows = []
    try:
        with httpx2.Client(timeout=120) as client:
            for page in pages:
                took = []
                size = 0
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    r = client.get(root + page)
                    took.append(time.perf_counter() - t0)
                    assert r.status_code == 200, (page, r.status_code)
                    size = len(r.content)
                warm = statistics.median(took[1:]) if len(took) > 1 else took[0]
                rows.append([page, f"{took[0] * 1000:.0f} ms", f"{warm * 1000:.0f} ms",
                             f"{size // 1024} KiB"])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"{args.conversations} conversations + one of {args.messages} messages (sqlite)")
    print(table(["page", "first", "median after", "HTML"], rows, "lrrr"))


if __name__ == "__main__":
    main()
