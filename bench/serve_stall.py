"""Can one client stall ``chatstate serve`` for the others? Two measurements, one table each.

    python bench/serve_stall.py [--messages 200001] [--stream-mb 50] [--chatstate PATH]

1. A large request beside small ones. One client sends small plain requests one
   after another the whole time; meanwhile another sends one request of
   ``--messages`` messages (200,001: ~8.5 MB), then reads that conversation back
   (``GET /v1/chatstate/conversations/{id}``). The small requests' latency before,
   during the large request and during the read says whether the large one held
   the event loop. The proxy runs with ``--max-messages`` raised to let the large
   request in; a second line shows what the default cap answers it.
2. A slow reader of a large stream. An upstream (``chatstate.testing.big_stream``, which
   the memory test uses too) streams a reply of ``--stream-mb`` MB as fast as it can; a
   client reads the first bytes through the proxy, stops reading for ``--stall``
   seconds, then reads the rest at full speed. The proxy's RSS before, at the end of the
   stall, and its peak say whether it buffered the reply; the same stream read at full
   speed, direct and through a second fresh proxy (its own peak), gives the relay's
   cost. Both on each ``--store`` (sqlite and json by default).

``--chatstate`` runs another build's ``chatstate`` (an older checkout's venv) for a
before/after; options that build does not know are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import CHATSTATE, start


# -- a fast upstream: SSE as fast as the socket takes it (chatstate.testing.big_stream, which
# the memory test uses too) ---------------------------------------------------------------------
# -- helpers ------------------------------------------------------------------------------------
def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def knows(chatstate: str, option: str) -> bool:
    out = subprocess.run([chatstate, "serve", "--help"], capture_output=True, text=True)
    return option in out.stdout


def serve(chatstate: str, store: str, upstream: str, env: dict[str, str],
          *extra: str) -> tuple[subprocess.Popen[str], str]:
    return start([chatstate, "--store", store, "serve", "--upstream", upstream, "--port", "0",
                  *extra], r"serving on (http://\S+/v1)", env)


def stop(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


# -- 1. a large request beside small ones ---------------------------------------------------------
class Smalls:
    """Small plain requests one after another in a thread; (start, seconds) of each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx2.Client(timeout=120) as client:
            n = 0
            while self.running:
                n += 1
                t0 = time.perf_counter()
                client.post(self.url + "/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": f"small {n}"}]})
                self.samples.append((t0, time.perf_counter() - t0))

    def between(self, a: float, b: float) -> list[float]:
        """Latencies of the requests that overlapped [a, b]."""
        return [d for t, d in self.samples if t < b and t + d > a]

    def stop(self) -> None:
        self.running = False
        self.thread.join(120)


def big_body(count: int) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 2}
                for i in range(count)]
    return json.dumps({"model": "m", "messages": messages}).encode()


def stall_table(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[str]:
    fake, base = start([args.chatstate, "fake-server", "--reply-words", "6"],
                       r"(http://\S+/v1)", env)
    body = big_body(args.messages)
    rows = []
    try:
        cap = ["--max-messages", str(args.messages + 1)] \
            if knows(args.chatstate, "--max-messages") else []
        proxy, url = serve(args.chatstate, f"sqlite://{work}/stall.db", base, env, *cap)
        try:
            smalls = Smalls(url)
            time.sleep(3)
            t_big = time.perf_counter()
            resp = httpx2.post(url + "/chat/completions", content=body, timeout=600,
                               headers={"content-type": "application/json"})
            t_read = time.perf_counter()
            cid = resp.headers.get("x-chatstate-conversation", "")
            read = httpx2.get(url + f"/chatstate/conversations/{cid}", timeout=600)
            t_end = time.perf_counter()
            time.sleep(1)
            smalls.stop()
            before = smalls.between(0, t_big)
            during = smalls.between(t_big, t_read)
            reading = smalls.between(t_read, t_end)
            rows.append(f"| small request alone | {statistics.median(before) * 1000:.0f} | "
                        f"{max(before) * 1000:.0f} | {len(before)} |")
            rows.append(f"| small, during the {args.messages:,}-message request "
                        f"({resp.status_code}, {(t_read - t_big):.1f} s, "
                        f"{len(body) / 1e6:.1f} MB) | {statistics.median(during) * 1000:.0f}"
                        f" | {max(during) * 1000:.0f} | {len(during)} |")
            rows.append(f"| small, during its read-back ({read.status_code}, "
                        f"{(t_end - t_read):.1f} s) | {statistics.median(reading) * 1000:.0f}"
                        f" | {max(reading) * 1000:.0f} | {len(reading)} |")
        finally:
            stop(proxy)
        if cap:
            proxy, url = serve(args.chatstate, f"sqlite://{work}/stall-cap.db", base, env)
            try:
                t0 = time.perf_counter()
                resp = httpx2.post(url + "/chat/completions", content=body, timeout=600,
                                   headers={"content-type": "application/json"})
                rows.append(f"| the same request, default --max-messages: "
                            f"{resp.status_code} in {(time.perf_counter() - t0) * 1000:.0f} ms"
                            " | | | |")
            finally:
                stop(proxy)
    finally:
        fake.send_signal(signal.SIGINT)
        fake.wait(30)
    return ["| small plain requests (one client, one after another) | p50 ms | max ms | n |",
            "|:---|---:|---:|---:|", *rows]


# -- 2. a slow reader of a large stream --------------------------------------------------------
def read_stream(url: str, stall: float, sample: Any = None,
                ask: str = "a big one") -> tuple[int, float]:
    """(bytes, seconds) of one streamed request; stops reading ``stall`` s after the first
    bytes, calling ``sample()`` at the end of the stall. ``ask``: the user message (each
    stream asks its own, or serve would answer a repeat from the stored turn)."""
    host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    body = json.dumps({"model": "big", "stream": True,
                       "messages": [{"role": "user", "content": ask}]}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    t0 = time.perf_counter()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() +
                 b"\r\ncontent-type: application/json\r\ncontent-length: " +
                 str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    total = len(sock.recv(65536))
    if stall:
        time.sleep(stall)
        if sample is not None:
            sample()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        total += len(data)
    sock.close()
    return total, time.perf_counter() - t0


def store_url(kind: str, work: Path, name: str) -> str:
    return f"sqlite://{work}/{name}.db" if kind == "sqlite" else f"json://{work}/{name}"


def memory_table(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[str]:
    """Each stream through a fresh serve process, so each has its own peak (VmHWM)."""
    size = args.stream_mb * 1000 * 1000
    up, base = start([sys.executable, "-m", "chatstate.testing.big_stream", str(size)],
                     r"serving on (http://\S+/v1)", env)
    rows = []
    try:
        direct_bytes, direct_s = read_stream(base, 0)
        for kind in args.stores:
            proxy, url = serve(args.chatstate, store_url(kind, work, f"slow-{kind}"), base, env)
            try:
                idle = rss_mb(proxy.pid)  # fresh: no stream yet
                stalled: list[float] = []
                slow_bytes, slow_s = read_stream(url, args.stall,
                                                 lambda s=stalled, p=proxy.pid:  # type: ignore[misc]
                                                 s.append(rss_mb(p)))
                peak = rss_mb(proxy.pid, "VmHWM")
            finally:
                stop(proxy)
            proxy, url = serve(args.chatstate, store_url(kind, work, f"fast-{kind}"), base, env)
            try:
                fast_idle = rss_mb(proxy.pid)
                fast_bytes, fast_s = read_stream(url, 0, ask="a fast one")
                fast_peak = rss_mb(proxy.pid, "VmHWM")
            finally:
                stop(proxy)
            rows.append(f"| {kind}: the same through serve, full speed | {fast_s:.2f} s "
                        f"({fast_bytes / 1e6:.0f} MB) | {fast_idle:.0f} / {fast_peak:.0f} MB "
                        f"(+{fast_peak - fast_idle:.0f}) |")
            rows.append(f"| {kind}: through serve, the reader stalled {args.stall:g} s: "
                        f"RSS fresh / at the end of the stall / peak | {slow_s:.1f} s "
                        f"({slow_bytes / 1e6:.0f} MB) | {idle:.0f} / {stalled[0]:.0f} / "
                        f"{peak:.0f} MB (+{peak - idle:.0f}) |")
    finally:
        stop(up)
    return [f"| {args.stream_mb} MB reply | time | serve RSS: fresh / peak (growth) |",
            "|:---|---:|---:|",
            f"| direct, full speed | {direct_s:.2f} s ({direct_bytes / 1e6:.0f} MB) | |", *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_001)
    parser.add_argument("--stream-mb", type=int, default=50)
    parser.add_argument("--stall", type=float, default=10.0)
    parser.add_argument("--dir", default="bench/work/serve-stall")
    parser.add_argument("--chatstate", default=CHATSTATE)
    parser.add_argument("--only", choices=["stall", "memory"])
    parser.add_argument("--store", dest="stores", action="append", choices=["sqlite", "json"],
                        help="the memory table's stores (default: both)")
    args = parser.parse_args()
    args.stores = args.stores or ["sqlite", "json"]
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    if args.only != "memory":
        print("\n".join(stall_table(args, work, env)) + "\n")
    if args.only != "stall":
        print("\n".join(memory_table(args, work, env)))


if __name__ == "__main__":
    main()
