"""Scenario 1: durable append cost per turn vs transcript length, and fsyncs counted.

Each system runs in its own driver process (drv_append.py). For every length n
and repetition, every system in turn (the order rotates per repetition, so
drift hits all alike) prefills a fresh transcript of n messages (untimed) and
persists ``k`` turns, each timed whole: user message, then the reply, ~500
bytes each. A second pass runs each driver under strace, with the timed turns
bracketed by marker syscalls, and counts fsync + fdatasync per turn.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .common import (
    AWS_ENV,
    COMPARE_PY,
    PROJECT_PY,
    WORK,
    Driver,
    Section,
    Target,
    log,
    median,
    ms,
    p99,
    ratio,
    table,
)
from .moto import Moto

CHATSTATE = ("chatstate-json", "chatstate-sqlite", "chatstate-s3")
LIBRARIES = ("langchain-file", "langchain-sql", "agents-sqlite", "llm")
SYSTEMS = ("floor", *CHATSTATE, *LIBRARIES)
NOTES = {
    "floor": "write + fsync of one JSON line per message (O_APPEND)",
    "chatstate-json": "temp file, fsync, rename, fsync dir; rewrites the file per append",
    "chatstate-sqlite": "WAL, synchronous=FULL, one transaction per message",
    "chatstate-s3": "conditional PUTs to moto on 127.0.0.1 (in-memory server)",
    "langchain-file": "FileChatMessageHistory: re-reads and rewrites the JSON file per "
                      "message",
    "langchain-sql": "SQLChatMessageHistory on SQLite via SQLAlchemy defaults",
    "agents-sqlite": "SQLiteSession (WAL, default synchronous) add_items per message",
    "llm": "log_to_db once per turn, after the reply (cannot persist before the call)",
}


@dataclass
class Plan:
    lengths: tuple[int, ...]
    reps: int
    k: int
    count_k: dict[int, int]


def plan(quick: bool) -> Plan:
    if quick:
        return Plan((10, 100, 1000), 3, 4, {10: 10, 100: 10, 1000: 10})
    return Plan((10, 100, 1000, 10_000), 8, 5, {10: 25, 100: 25, 1000: 25, 10_000: 5})


def _drivers(work: Path, moto: Moto, strace_dir: Path | None = None) -> dict[str, Driver]:
    drivers = {}
    for name in SYSTEMS:
        py = PROJECT_PY if name == "floor" or name in CHATSTATE else COMPARE_PY
        url = {"chatstate-json": f"json://{work / 'json'}",
               "chatstate-sqlite": f"sqlite://{work / 'chatstate.db'}",
               "chatstate-s3": moto.new_store_url() if name == "chatstate-s3" else ""}.get(name)
        wrap: list[str] = []
        if strace_dir is not None:
            wrap = ["strace", "-f", "-qq", "--seccomp-bpf", "-e",
                    "trace=fsync,fdatasync,getppid", "-o", str(strace_dir / f"{name}.txt")]
        drivers[name] = Driver(py, "drv_append.py", [name, str(work), *([url] if url else [])],
                               env=AWS_ENV, wrap=wrap)
    return drivers


def _one(driver: Driver, n: int, k: int, mark: bool = False) -> list[float]:
    driver.call(op="setup", n=n)
    times = driver.call(op="turns", k=k, mark=mark)["times_ns"]
    driver.call(op="teardown")
    return [t / 1e9 for t in times]


def measure(p: Plan, moto: Moto) -> dict[tuple[str, int], list[float]]:
    work = WORK / "append"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    drivers = _drivers(work, moto)
    samples: dict[tuple[str, int], list[float]] = {}
    try:
        for n in p.lengths:
            log(f"append: length {n}")
            for name in SYSTEMS:  # warm-up: imports, caches, llm's template
                _one(drivers[name], n, 1)
            for rep in range(p.reps):
                order = SYSTEMS[rep % len(SYSTEMS):] + SYSTEMS[:rep % len(SYSTEMS)]
                for name in order:
                    samples.setdefault((name, n), []).extend(_one(drivers[name], n, p.k))
    finally:
        for d in drivers.values():
            d.close()
    return samples


def count_fsyncs(p: Plan, moto: Moto) -> dict[tuple[str, int], float]:
    """fsync + fdatasync per turn, from an strace of each driver (all threads)."""
    if shutil.which("strace") is None:
        return {}
    work = WORK / "append-strace"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    drivers = _drivers(work, moto, strace_dir=work)
    try:
        for n in p.lengths:
            log(f"append: counting fsyncs at length {n}")
            for name in SYSTEMS:
                _one(drivers[name], n, p.count_k[n], mark=True)
    finally:
        for d in drivers.values():
            d.close()
    counts: dict[tuple[str, int], float] = {}
    for name in SYSTEMS:
        segments = _segments((work / f"{name}.txt").read_text())
        for n, seg in zip(p.lengths, segments, strict=True):
            counts[(name, n)] = seg / p.count_k[n]
    return counts


_CALL = re.compile(r"^\d+\s+(fsync|fdatasync|getppid)\(")


def _segments(trace: str) -> list[int]:
    """fsync counts between each pair of getppid markers."""
    out, inside, count = [], False, 0
    for line in trace.splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        if m.group(1) == "getppid":
            if inside:
                out.append(count)
            inside, count = not inside, 0
        elif inside:
            count += 1
    return out


def _cell(xs: list[float]) -> str:
    return f"{ms(median(xs))} / {ms(p99(xs))}"


def _durable(name: str, counts: dict[tuple[str, int], float], lengths: tuple[int, ...]) -> str:
    if name == "chatstate-s3":
        return "remote ack (moto keeps objects in memory; a real S3 acks after storing)"
    if not counts:
        return "not counted (no strace)"
    if all(counts[(name, n)] == 0 for n in lengths):
        return "**not durable**: 0 fsyncs, an acked turn can vanish on power loss"
    return "fsync'd before returning"


def _slope(a: float, b: float, na: int, nb: int) -> float:
    return math.log(b / a) / math.log(nb / na)


def report(p: Plan, samples: dict[tuple[str, int], list[float]],
           counts: dict[tuple[str, int], float]) -> Section:
    lengths = p.lengths
    heads = [f"{n:,}" for n in lengths]
    floor = {n: median(samples[("floor", n)]) for n in lengths}
    rows_ms, rows_ratio, rows_fs = [], [], []
    for name in SYSTEMS:
        rows_ms.append([name, *(_cell(samples[(name, n)]) for n in lengths)])
        meds = [median(samples[(name, n)]) for n in lengths]
        slope = _slope(meds[-2], meds[-1], lengths[-2], lengths[-1])
        rows_ratio.append([name, *(ratio(m / floor[n]) for m, n in zip(meds, lengths,
                                                                       strict=True)),
                           f"{slope:.2f}"])
        fs = [f"{counts[(name, n)]:.2f}" if counts else "-" for n in lengths]
        rows_fs.append([name, *fs, _durable(name, counts, lengths), NOTES[name]])
    samples_n = len(samples[("floor", lengths[0])])
    body = "\n\n".join([
        f"Milliseconds per turn (user message + reply, ~500 bytes each), median / p99 of "
        f"{samples_n} turns ({p.reps} repetitions × {p.k} turns, systems interleaved; "
        f"with fewer than 100 samples p99 is the maximum). Transcript length n at the start "
        f"of a repetition; each repetition starts from a fresh transcript of n messages.",
        table(["system", *heads], rows_ms),
        "Ratio of the median to the floor's median at the same length, and the growth "
        "exponent between the two longest lengths (cost ∝ n^x: 0 = flat, 1 = linear "
        "in the transcript).",
        table(["system", *heads, f"x ({lengths[-2]:,}→{lengths[-1]:,})"], rows_ratio),
        "fsync + fdatasync calls per turn (2 messages), counted with `strace -f` over "
        f"{', '.join(f'{p.count_k[n]}' for n in lengths)} turns at each length, all threads "
        "of the driver process. SQLite WAL checkpoints (every ~1000 pages) add a few "
        "fsyncs that short runs may not catch.",
        table(["system", *heads, "durable?", "how it persists"], rows_fs,
              "l" + "r" * len(lengths) + "ll"),
    ])
    return Section("1. Durable append cost per turn", body,
                   _targets(p, samples, counts, floor))


def _targets(p: Plan, samples: dict[tuple[str, int], list[float]],
             counts: dict[tuple[str, int], float], floor: dict[int, float]) -> list[Target]:
    lengths = p.lengths
    med = {key: median(v) for key, v in samples.items()}
    out = []
    if counts:
        per_msg = max(counts[("chatstate-sqlite", n)] / 2 for n in lengths)
        out.append(Target("append", "sqlite ≤ 2 fsyncs per message", f"{per_msg:.2f} max",
                          per_msg <= 2, "" if per_msg <= 2 else "see the fsync table"))
    ratios = [med[("chatstate-sqlite", n)] / floor[n] for n in lengths]
    worst = max(ratios)
    fs_floor = counts.get(("floor", lengths[0]), 2.0) if counts else 2.0
    fs_sqlite = max(counts[("chatstate-sqlite", n)] for n in lengths) if counts else float("nan")
    why = ("" if worst <= 1.5 else
           f"same fsyncs per turn as the floor ({fs_sqlite:.1f} vs {fs_floor:.1f}), but "
           "cProfile puts ~93% of a turn in SQLite's COMMIT: each commit appends 4 KiB WAL "
           "frames (message row, FTS5 index, header row) and its fdatasync must also commit "
           "the grown file's metadata, where the floor's ~0.6 KB lines mostly land in an "
           "already allocated block. Python work is ~0.1 ms per turn")
    out.append(Target("append", "sqlite ≤ 1.5× floor at every length",
                      ", ".join(ratio(r) for r in ratios), worst <= 1.5, why))
    if 1000 in lengths:
        r = med[("chatstate-json", 1000)] / floor[1000]
        out.append(Target("append", "json ≤ 3× floor at 1,000", ratio(r), r <= 3,
                          "" if r <= 3 else "each append rewrites the whole file (~0.7 MB "
                          "at 1,000 messages) and fsyncs it and its directory: 4 fsyncs per "
                          "turn vs the floor's 2"))
    for name in ("chatstate-sqlite", "chatstate-json"):
        x = _slope(med[(name, lengths[-2])], med[(name, lengths[-1])], lengths[-2],
                   lengths[-1])
        ok = x <= 1.1
        out.append(Target("append", f"{name.split('-')[1]} grows no faster than the transcript",
                          f"x = {x:.2f} ({lengths[-2]:,}→{lengths[-1]:,})", ok,
                          "" if ok else "cost grows faster than n"))
    n = 1000 if 1000 in lengths else lengths[-1]
    mine = med[("chatstate-sqlite", n)]
    for lib in LIBRARIES:
        theirs = med[(lib, n)]
        ok = mine < theirs
        why = ""
        if not ok:
            zero = counts and all(counts[(lib, m)] == 0 for m in lengths)
            why = ("it never fsyncs: faster because it is not durable" if zero else
                   f"{lib} does {counts.get((lib, n), float('nan')):.1f} fsyncs per turn vs "
                   f"chatstate's {counts.get(('chatstate-sqlite', n), float('nan')):.1f}; "
                   "chatstate also seals a hash chain and checks compare-and-append")
        out.append(Target("append", f"chatstate-sqlite beats {lib} at {n:,}",
                          f"{ms(mine)} vs {ms(theirs)} ms ({ratio(mine / theirs)})", ok, why))
    return out


def run(quick: bool, moto: Moto) -> Section:
    p = plan(quick)
    samples = measure(p, moto)
    counts = count_fsyncs(p, moto)
    return report(p, samples, counts)

