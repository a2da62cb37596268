"""Scenario 8: the json store's append is O(1) (issue 26): one message through the
Store API at 10 to 50,000 stored messages, against the jsonl+fsync floor in the same
process (interleaved), on this disk and with every fsync delayed 5 ms (strace fault
injection: a laptop SSD, a network disk). The append writes one checksummed record
to the end of the conversation file and fsyncs it: one fsync, like the floor.
"""

from __future__ import annotations

import json
import shutil
import subprocess

from .common import BENCH, PROJECT_PY, WORK, Section, Target, log, median, ms, ratio, table
from .s_slowdisk import STRACE


def run(quick: bool) -> Section:
    lengths = (10, 1000, 5000) if quick else (10, 1000, 5000, 50_000)
    k = 20 if quick else 40
    slow_ok = shutil.which("strace") is not None
    rows, targets = [], []
    worst, worst_slow = 0.0, 0.0
    for n in lengths:
        got = {}
        for disk in ("fast", "slow") if slow_ok else ("fast",):
            log(f"jsonlog: {n:,} messages, {disk} disk")
            wrap = STRACE if disk == "slow" else []
            out = subprocess.run([*wrap, str(PROJECT_PY), str(BENCH / "drv_jsonlog.py"),
                                  str(WORK / "jsonlog" / disk), str(n), str(k)],
                                 capture_output=True, text=True, check=True, cwd=WORK)
            got[disk] = json.loads(out.stdout)
        fast = median(got["fast"]["json"]) / median(got["fast"]["floor"])
        worst = max(worst, fast)
        cells = [f"{n:,}", ms(median(got["fast"]["json"])), ms(median(got["fast"]["floor"])),
                 ratio(fast)]
        if slow_ok:
            slow = median(got["slow"]["json"]) / median(got["slow"]["floor"])
            worst_slow = max(worst_slow, slow)
            cells += [ms(median(got["slow"]["json"])), ms(median(got["slow"]["floor"])),
                      ratio(slow)]
        rows.append(cells)
    upto = f"{lengths[-1]:,}"
    targets.append(Target("json append", f"≤ 3× the jsonl+fsync floor at every N up to {upto}",
                          f"{ratio(worst)} worst", worst <= 3,
                          "" if worst <= 3 else "the record's encoding and checks"))
    targets.append(Target("json append", "with fsync delayed 5 ms ≤ 1.3× the floor",
                          f"{ratio(worst_slow)} worst" if slow_ok else "-",
                          (worst_slow <= 1.3) if slow_ok else None,
                          "" if not slow_ok or worst_slow <= 1.3 else
                          "more than one fsync per append"))
    head = ["stored messages", "json ms", "floor ms", "json / floor"]
    if slow_ok:
        head += ["json ms, 5 ms fsyncs", "floor ms, 5 ms fsyncs", "json / floor, slow"]
    body = "\n\n".join([
        f"One ~500-byte message appended through `Store.append` to a conversation of N "
        f"messages, {k} appends per N, each interleaved with one write+fsync of a JSON line "
        "to an O_APPEND file (the floor) in the same driver process (bench/drv_jsonlog.py); "
        "medians. Slow = the driver under `strace --seccomp-bpf -e "
        "inject=fsync,fdatasync:delay_enter=5000`. Before the append log (issue 26) the "
        "json store rewrote the whole file per append: 14.5 ms at 5,000 messages, "
        "k = 0.88, and 2.2–2.8× the floor with slow fsyncs (a file and a directory "
        "fsync per append).",
        table(head, rows),
    ])
    return Section("8. json append: O(1)", body, targets)
