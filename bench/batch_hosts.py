"""Batch throughput on a shared PostgreSQL ledger: 1 worker process against 3.

    .venv/bin/python bench/batch_hosts.py [--latency 0.2] [--records 400] [-j 4] [--dir DIR]

Each worker is a separate ``chatstate batch run`` process (as a host would
be) with ``-j`` request slots, on one ledger in a local PostgreSQL server
(started here, in the work directory, as the tests do) and one output
directory, against the fake model in its own process at a fixed latency.
The same records run once with 1 worker and once with 3, each on a fresh
ledger schema. "records/s" is the steady rate: records done between the first
and the last ``done`` in the ledger, over that time; "wall" includes process
start-up (imports, connecting, registering the input). Target: 3 workers give
at least 2.7 times the records/s of 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 2.7


@contextlib.contextmanager
def postgres(work: Path) -> Iterator[str]:
    """A throwaway local PostgreSQL server (tests/support/pgserver.py); yields its URL."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support import pgserver

    server = pgserver.start_server(work / "pg")
    try:
        yield server.new_database()
    finally:
        server.stop()


@contextlib.contextmanager
def fake_server(latency: float) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "chatstate", "fake-server",
                             "--latency", str(latency)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_level(work: Path, ledger: str, base_url: str, workers: int, records: Path,
              concurrency: int) -> tuple[float, float, int]:
    """(steady records/s, wall seconds, records done) for ``workers`` processes."""
    import psycopg

    schema = f"bench{workers}"
    url = f"{ledger}?schema={schema}"
    out = work / f"out-{workers}"
    args = [sys.executable, "-m", "chatstate", "batch", "run", str(records), "--prompt",
            "Summarise: {text}", "--out", str(out), "--ledger", url, "--base-url", base_url,
            "--model", "fake-model", "-j", str(concurrency)]
    env = {**os.environ, "CHATSTATE_API_KEY": "offline"}
    started = time.monotonic()
    procs = [subprocess.Popen([*args, "--host-id", f"bench-host-{n}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for n in range(workers)]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a worker failed (exit {proc.returncode}): {err[-2000:]}")
    wall = time.monotonic() - started
    with psycopg.connect(ledger, autocommit=True) as db:
        rows = db.execute(f"SELECT done_at FROM {schema}.records "  # type: ignore[arg-type]
                          "WHERE status='done'").fetchall()
    stamps = sorted(datetime.fromisoformat(str(r[0]).replace("Z", "+00:00")).timestamp()
                    for r in rows)
    steady = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return steady, wall, len(stamps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="fake model latency, s")
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("-j", "--concurrency", type=int, default=4,
                        help="request slots per worker")
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".bench-hosts-") as tmp:
        work = Path(tmp)
        source = work / "in.jsonl"
        source.write_text("".join(json.dumps({"id": f"r{n}", "text": f"record {n}"}) + "\n"
                                  for n in range(args.records)))
        with postgres(work) as ledger, fake_server(args.latency) as base_url:
            results = {n: run_level(work, ledger, base_url, n, source, args.concurrency)
                       for n in (1, 3)}
    print(f"Batch throughput on a shared PostgreSQL ledger, fake model at "
          f"{args.latency * 1000:.0f} ms, {args.records} records, -j {args.concurrency} "
          "per worker:\n")
    print("| workers | records | wall s | records/s (steady) | ideal/s | vs 1 worker |")
    print("|---:|---:|---:|---:|---:|---:|")
    base = results[1][0]
    for n, (rate, wall, done) in results.items():
        ideal = n * args.concurrency / args.latency
        print(f"| {n} | {done} | {wall:.1f} | {rate:.1f} | {ideal:.0f} | {rate / base:.2f}× |")
    ratio = results[3][0] / base
    print(f"\nTarget: 3 workers ≥ {TARGET}× the records/s of 1: "
          f"{'met' if ratio >= TARGET else 'NOT met'} ({ratio:.2f}×).")


if __name__ == "__main__":
    main()
