"""Batch throughput against the ideal, with the built-in fake model at a fixed latency.

The ideal is concurrency / latency records per second: every request slot
always busy, zero overhead. The measured run includes everything a real run
does per record: the claim, the attempt committed before the request, the
atomic output write with its fsyncs, and ``done`` with the hash, all on a
durable disk (the ledger uses synchronous=FULL). Startup (probe, registration,
recovery) is included too.

    .venv/bin/python bench/batch_throughput.py [--latency 0.2] [--seconds 5] [--dir DIR]

Prints a markdown table. "bare HTTP" is the same number of plain adapter calls
from the same number of threads, with no ledger and no files: the ceiling the
model endpoint itself allows, so "vs bare HTTP" is what the batch machinery
costs on top. The fake model runs in its own process (as a provider
would), so it does not share the runner's interpreter. The work directory
defaults to a hidden temporary directory next to this script (a real disk,
unlike /tmp on many hosts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from chatstate.batch import Batch

LEVELS = (1, 4, 16)


def measure(work: Path, base_url: str, concurrency: int, records: int) -> tuple[float, int]:
    """Run ``records`` records at ``concurrency``; return (elapsed seconds, records done)."""
    source = work / f"in-{concurrency}.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{n}", "text": f"record {n}"}) + "\n"
                              for n in range(records)))
    with Batch(work / f"out-{concurrency}", prompt="Summarise: {text}", model="fake",
               base_url=base_url, api_key="offline", concurrency=concurrency,
               echo=lambda line: None) as batch:
        summary = batch.run(source)
        problems = batch.verify()
    if problems or summary.counts["done"] != records:
        raise SystemExit(f"benchmark run was not clean: {summary.lines()} {problems}")
    return summary.elapsed, summary.done_now


@contextlib.contextmanager
def fake_server(latency: float) -> Iterator[str]:
    """The fake model in its own process, as a provider would be; yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "chatstate", "fake-server",
                             "--latency", str(latency)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def raw_rate(base_url: str, concurrency: int, requests: int) -> float:
    """Requests/s of bare adapter calls from ``concurrency`` threads: the HTTP ceiling."""
    from chatstate.adapter import make_adapter

    adapter = make_adapter(model="fake", base_url=base_url, api_key="offline")
    numbers = iter(range(requests))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            adapter.complete([{"role": "user", "content": f"Summarise: raw {n}"}])

    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    adapter.close()
    return requests / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="fake model latency, s")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="target duration of each level at the ideal rate")
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--base-url", help="use this running fake model (started with the "
                        "same --latency) instead of starting one")
    args = parser.parse_args()
    rows = []
    server = (contextlib.nullcontext(args.base_url) if args.base_url
              else fake_server(args.latency))
    with server as base_url, \
            tempfile.TemporaryDirectory(dir=args.dir, prefix=".bench-") as tmp:
        for concurrency in LEVELS:
            ideal = concurrency / args.latency
            records = max(int(ideal * args.seconds), concurrency)
            elapsed, done = measure(Path(tmp), base_url, concurrency, records)
            raw = raw_rate(base_url, concurrency, records)
            rows.append((concurrency, done, elapsed, done / elapsed, raw, ideal))
    print(f"Batch throughput, fake model at {args.latency * 1000:.0f} ms latency "
          f"(work dir on {args.dir}):\n")
    print("| concurrency | records | seconds | records/s | bare HTTP calls/s | ideal/s "
          "| vs ideal | vs bare HTTP |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, n, secs, rate, raw, ideal in rows:
        print(f"| {c} | {n} | {secs:.2f} | {rate:.1f} | {raw:.1f} | {ideal:.1f} "
              f"| {rate / ideal:.0%} | {rate / raw:.0%} |")


if __name__ == "__main__":
    main()
