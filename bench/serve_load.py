"""Load on ``chatstate serve``: N concurrent streamed conversations, proxy vs. upstream alone.

    python bench/serve_load.py [--conversations 200] [--stores sqlite json] [--dir DIR]
                               [--chatstate PATH]

One fake upstream (its own process) streams every reply in ``--words`` chunks,
``--chunk-delay`` apart. The same asyncio client first talks to the upstream
directly, then through the proxy on each store, N streams at once, and records
per request the time to the first content chunk and to the end. Afterwards
every proxied conversation is loaded from the store: it must hold exactly the
user message and one complete reply equal to the text the client received
(anything else counts as lost or duplicated). Each store runs twice: with the
conversation header (each request names its own conversation) and header-less
(each is a first turn, so each starts a new conversation found by its history:
the proxy must not serialise them). Prints a markdown table. ``--chatstate`` runs
another build's ``chatstate`` (an older checkout's venv) for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2

CHATSTATE = str(Path(sys.executable).with_name("chatstate"))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def start(argv: list[str], pattern: str, env: dict[str, str]) -> tuple[subprocess.Popen[str],
                                                                       str]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(pattern, line)
        if match:
            return proc, match.group(1)
    raise RuntimeError(f"{argv[1:3]} did not start")


async def one(client: httpx2.AsyncClient, url: str, n: int,
              prefix: str | None = "load") -> tuple[float, float, str, str]:
    """One streamed first turn; ``prefix`` None: header-less (found by its history)."""
    body = {"model": "m", "stream": True,
            "messages": [{"role": "user", "content": f"load {n} {prefix}"}]}
    headers = {} if prefix is None else {"X-Chatstate-Conversation": f"{prefix}-{n}"}
    t0 = time.perf_counter()
    first, parts, cid = 0.0, [], ""
    async with client.stream("POST", url + "/chat/completions", json=body,
                             headers=headers) as resp:
        resp.raise_for_status()
        cid = resp.headers.get("x-chatstate-conversation", "")
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    if not first:
                        first = time.perf_counter() - t0
                    parts.append(chunk["choices"][0]["delta"]["content"])
    return first, time.perf_counter() - t0, cid, "".join(parts)


async def one_at_a_time(url: str, count: int, prefix: str) -> list[tuple[float, float, str, str]]:
    """The same requests, each after the previous one ended: the proxy's own latency."""
    async with httpx2.AsyncClient(timeout=120) as client:
        return [await one(client, url, n, prefix) for n in range(count)]


async def wave(url: str, count: int, prefix: str | None = "load"
               ) -> list[tuple[float, float, str, str]]:
    limits = httpx2.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(one(client, url, n, prefix) for n in range(count)))


def check(store_url: str, results: list[tuple[float, float, str, str]]) -> tuple[int, int]:
    from chatstate.stores import open_store

    lost = dup = 0
    store = open_store(store_url)
    try:
        for _, _, cid, text in results:
            conv = store.load(cid)
            replies = [m for m in conv.messages if m.role == "assistant"]
            users = [m for m in conv.messages if m.role == "user"]
            dup += max(0, len(replies) - 1) + max(0, len(users) - 1)
            if not replies or replies[-1].text != text or replies[-1].status != "complete":
                lost += 1
    finally:
        store.close()
    return lost, dup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--chunk-delay", type=float, default=0.02)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "json"])
    parser.add_argument("--dir", default="bench/work/serve")
    parser.add_argument("--chatstate", default=CHATSTATE,
                        help="the chatstate executable to measure (default: this venv's)")
    parser.add_argument("--slow-fsync-ms", type=float, default=0,
                        help="delay every fsync of the proxy by this much (strace fault "
                        "injection): a laptop SSD or a network disk")
    args = parser.parse_args()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    fake, base = start([args.chatstate, "fake-server", "--reply-words", str(args.words),
                        "--chunk-delay", str(args.chunk_delay)], r"(http://\S+/v1)", env)
    rows = []
    try:
        runs: list[tuple[str, str | None]] = [("upstream alone", None),
                                              ("through a bare relay (floor)", "floor")]
        runs += [(f"through serve ({kind}{', header-less' if headerless else ''})",
                  f"{kind}{'-headerless' if headerless else ''}")
                 for kind in args.stores for headerless in (False, True)]
        direct: list[tuple[float, float, str, str]] = []
        serial: dict[str, list[float]] = {}
        for label, kind in runs:
            proxy = None
            url = base
            if kind == "floor":
                proxy, url = start([sys.executable, str(Path(__file__).with_name(
                    "relay_floor.py")), "--upstream", base], r"serving on (http://\S+/v1)", env)
            elif kind is not None:
                store_kind = kind.removesuffix("-headerless")
                store_url = (f"sqlite://{work}/{kind}.db" if store_kind == "sqlite"
                             else f"json://{work}/{kind}")
                slow = ["strace", "-f", "-o", "/dev/null", "--seccomp-bpf", "-e",
                        "trace=fsync,fdatasync", "-e", "inject=fsync,fdatasync:delay_enter="
                        f"{int(args.slow_fsync_ms * 1000)}"] if args.slow_fsync_ms else []
                proxy, url = start([*slow, args.chatstate, "--store", store_url, "serve",
                                    "--upstream", base, "--port", "0"],
                                   r"serving on (http://\S+/v1)", env)
            try:
                asyncio.run(wave(url, 4, "warm"))  # imports and connections, not measured
                serial[label] = [r[0] for r in asyncio.run(one_at_a_time(url, 20, "serial"))]
                t0 = time.perf_counter()
                headerless = kind is not None and kind.endswith("-headerless")
                results = asyncio.run(wave(url, args.conversations,
                                           None if headerless else "load"))
                wall = time.perf_counter() - t0
            finally:
                if proxy is not None:
                    os.killpg(proxy.pid, signal.SIGTERM)  # the proxy, also under strace
                    proxy.wait(60)
            firsts = [r[0] for r in results]
            totals = [r[1] for r in results]
            lost = dup = "-"
            added = "-"
            if kind is None:
                direct = results
            elif kind == "floor":
                added = f"{(pct(firsts, .5) - pct([r[0] for r in direct], .5)) * 1000:+.1f}"
            else:
                lost_n, dup_n = check(store_url, results)
                lost, dup = str(lost_n), str(dup_n)
                d_first = [r[0] for r in direct]
                added = f"{(pct(firsts, .5) - pct(d_first, .5)) * 1000:+.1f}"
            rows.append([label, f"{pct(firsts, .5) * 1000:.1f}", f"{pct(firsts, .99) * 1000:.1f}",
                         f"{pct(totals, .5) * 1000:.0f}", f"{pct(totals, .99) * 1000:.0f}",
                         added, f"{wall:.1f}", lost, dup])
    finally:
        fake.send_signal(signal.SIGINT)
        fake.wait(30)
    slow = f"; every fsync of the proxy delayed {args.slow_fsync_ms:g} ms" \
        if args.slow_fsync_ms else ""
    print(f"{args.conversations} concurrent streamed conversations, {args.words} chunks each, "
          f"{args.chunk_delay * 1000:.0f} ms apart (fake upstream in its own process{slow}):\n")
    header = ["run", "first chunk p50 ms", "p99 ms", "complete p50 ms", "p99 ms",
              "added to first-chunk p50 ms", "wall s", "lost", "duplicated"]
    print("| " + " | ".join(header) + " |")
    print("|:---|" + "---:|" * (len(header) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    alone = pct(serial["upstream alone"], .5)
    print("\nOne request at a time (20 each, after a warm-up), time to the first chunk:\n")
    print("| run | p50 ms | added ms |")
    print("|:---|---:|---:|")
    for label, firsts in serial.items():
        added = "-" if label == "upstream alone" else f"{(pct(firsts, .5) - alone) * 1000:+.1f}"
        print(f"| {label} | {pct(firsts, .5) * 1000:.1f} | {added} |")


if __name__ == "__main__":
    main()
