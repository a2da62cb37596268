"""Scenario 5: batch throughput, by running bench/batch_throughput.py (its own table).

That script belongs to the batch runner; this scenario only runs it as a
subprocess with its work directory under bench/work and includes what it prints.
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
    return Section("5. Batch throughput", body)
