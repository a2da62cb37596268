"""Scenario 7: ``chatstate serve`` under load, by running bench/serve_load.py (its own table).

200 concurrent streamed conversations through the proxy on sqlite and json, next
to the same client talking to the fake upstream alone; every conversation is
checked in the store afterwards (lost, duplicated).
"""

from __future__ import annotations

import subprocess

from .common import BENCH, PROJECT_PY, WORK, Section, log


def run(quick: bool) -> Section:
    count = "50" if quick else "200"
    log(f"serve: bench/serve_load.py --conversations {count}")
    out = subprocess.run([str(PROJECT_PY), str(BENCH / "serve_load.py"), "--conversations",
                          count, "--dir", str(WORK / "serve")], capture_output=True, text=True,
                         cwd=WORK)
    if out.returncode:
        body = (f"`bench/serve_load.py` failed (exit {out.returncode}):\n\n```\n"
                f"{out.stderr[-2000:]}\n```")
    else:
        body = (f"Output of `bench/serve_load.py --conversations {count}`. Goal: the proxy "
                "adds at most 5 ms to the p50 of the first chunk, with 0 lost and 0 "
                "duplicated.\n\n" + out.stdout.strip())
    return Section("7. chatstate serve under load", body)
