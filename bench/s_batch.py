"""Scenario 5: batch throughput, by running bench/batch_throughput.py (its own table),
then bench/batch_hosts.py (1 worker against 3 on a shared PostgreSQL ledger).

Those scripts belong to the batch runner; this scenario only runs them as
subprocesses with their work directory under bench/work and includes what they print.
"""

from __future__ import annotations

import shutil
import subprocess

from .common import BENCH, PROJECT_PY, WORK, Section, log


def run(quick: bool) -> Section:
    script = BENCH / "batch_throughput.py"
    if not script.exists():
        return Section("5. Batch throughput", "bench/batch_throughput.py is not in this "
                       "checkout: not run.")
    work = WORK / "batch"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    seconds = "1.5" if quick else "3"
    log(f"batch: bench/batch_throughput.py --seconds {seconds}")
    out = subprocess.run([str(PROJECT_PY), str(script), "--latency", "0.2", "--seconds",
                          seconds, "--dir", str(work)], capture_output=True, text=True,
                         cwd=WORK)
    if out.returncode:
        body = (f"`bench/batch_throughput.py` failed (exit {out.returncode}):\n\n```\n"
                f"{out.stderr[-2000:]}\n```")
    else:
        body = (f"Output of `bench/batch_throughput.py --latency 0.2 --seconds {seconds} "
                f"--dir bench/work/batch` (the ideal is concurrency ÷ latency):\n\n"
                f"{out.stdout.strip()}")
    return Section("5. Batch throughput", body + "\n\n" + _hosts(quick, work))


def _hosts(quick: bool, work: object) -> str:
    records = "200" if quick else "400"
    log(f"batch: bench/batch_hosts.py --records {records}")
    out = subprocess.run([str(PROJECT_PY), str(BENCH / "batch_hosts.py"), "--latency", "0.2",
                          "--records", records, "--dir", str(work)], capture_output=True,
                         text=True, cwd=WORK)
    if out.returncode:
        return (f"`bench/batch_hosts.py` failed (exit {out.returncode}):\n\n```\n"
                f"{out.stderr[-2000:]}\n```")
    return (f"Output of `bench/batch_hosts.py --latency 0.2 --records {records} --dir "
            f"bench/work/batch`:\n\n{out.stdout.strip()}")
