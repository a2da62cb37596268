"""Batch throughput against the ideal, with the built-in fake model at a fixed latency.

The ideal is concurrency / latency records per second: every request slot
always busy, zero overhead. The measured run includes everything a real run
does per record: the claim, the attempt committed before the request, the
atomic output write with its fsyncs, and ``done`` with the hash, all on a
durable disk (the ledger uses synchronous=FULL). Startup (probe, registration,
recovery) is included too.

    .venv/bin/python bench/batch_throughput.py [--latency 0.2] [--seconds 5] [--dir DIR]

Prints a markdown table. The fake model runs in its own process (as a provider
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="fake model latency, s")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="target duration of each level at the ideal rate")
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    rows = []
    with fake_server(args.latency) as base_url, \
            tempfile.TemporaryDirectory(dir=args.dir, prefix=".bench-") as tmp:
        for concurrency in LEVELS:
            ideal = concurrency / args.latency
            records = max(int(ideal * args.seconds), concurrency)
            elapsed, done = measure(Path(tmp), base_url, concurrency, records)
            rate = done / elapsed
            rows.append((concurrency, done, elapsed, rate, ideal, rate / ideal))
    print(f"Batch throughput, fake model at {args.latency * 1000:.0f} ms latency "
          f"(work dir on {args.dir}):\n")
    print("| concurrency | records | seconds | records/s | ideal records/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c, n, secs, rate, ideal, ratio in rows:
        print(f"| {c} | {n} | {secs:.2f} | {rate:.1f} | {ideal:.1f} | {ratio:.0%} |")


if __name__ == "__main__":
    main()
