"""Before / after in one run: two checkouts side by side, interleaved.

    python bench/before_after.py BEFORE_CHECKOUT AFTER_CHECKOUT [--rounds 10] [--loads 3]

Each checkout runs with the project interpreter and ``PYTHONPATH`` set to it. Start-up:
per round, ``chatstate ask --base-url LOCAL hi`` from each checkout, ``llm --version``
(bench/.venv) and ``python -c "import openai"``, against the fake model in its own process
and a sqlite store under bench/work; medians and the ratios of the medians, of wall time
and of CPU time (user + system, which a loaded machine inflates less). Load: the
100,000-message chain of ``drv_load.py prepare`` loaded in a fresh process per run,
checkouts alternating, CPU seconds (``time.process_time``), which a loaded machine
inflates less than wall seconds. Prints a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
WORK = BENCH / "work" / "before_after"
PY = sys.executable
LOAD = """
import json, sys, time
from chatstate import open_store
store = open_store(sys.argv[1])
c0, w0 = time.process_time(), time.perf_counter()
conv = store.load(sys.argv[2])
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0,
                  "messages": len(conv.messages)}))
"""


def _wall(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of ``cmd``."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, cwd=WORK)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def startup(checkouts: dict[str, str], rounds: int) -> dict[str, object]:
    fake = subprocess.Popen([PY, "-m", "chatstate.testing.fake_server"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=WORK)
    assert fake.stdout is not None
    url = fake.stdout.readline().strip()
    store = {"CHATSTATE_STORE": f"sqlite://{WORK / 'ask.db'}"}
    exe = str(Path(PY).with_name("chatstate"))
    commands = {name: ([exe, "ask", "--base-url", url, "hi"],
                       {**os.environ, **store, "PYTHONPATH": path})
                for name, path in checkouts.items()}
    commands["llm --version"] = ([str(BENCH / ".venv" / "bin" / "llm"), "--version"],
                                 dict(os.environ))
    commands["import openai"] = ([PY, "-c", "import openai"], dict(os.environ))
    for path in checkouts.values():  # .pyc files as pip writes them (PYTHONDONTWRITEBYTECODE
        # may be set): no checkout pays for compiling its sources on every run
        subprocess.run([PY, "-m", "compileall", "-q", "-j", "0", str(Path(path) / "chatstate")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    times: dict[str, list[float]] = {n: [] for n in commands}
    cpu: dict[str, list[float]] = {n: [] for n in commands}
    try:
        for cmd, env in commands.values():  # warm-up: caches, .pyc
            _wall(cmd, env)
        for _ in range(rounds):
            for name, (cmd, env) in commands.items():
                wall, used = _wall(cmd, env)
                times[name].append(wall)
                cpu[name].append(used)
    finally:
        fake.terminate()
        fake.wait(10)
    med = {n: statistics.median(t) for n, t in times.items()}
    med_cpu = {n: statistics.median(t) for n, t in cpu.items()}
    return {"median_ms": {n: round(v * 1000) for n, v in med.items()},
            "ratios": {n: {"llm --version": round(med[n] / med["llm --version"], 2),
                           "import openai": round(med[n] / med["import openai"], 2)}
                       for n in checkouts},
            # CPU (user + system) of each process: what a loaded machine inflates least
            "cpu_median_ms": {n: round(v * 1000) for n, v in med_cpu.items()},
            "cpu_ratios": {n: {"llm --version": round(med_cpu[n] / med_cpu["llm --version"], 2),
                               "import openai": round(med_cpu[n] / med_cpu["import openai"], 2)}
                           for n in checkouts}}


def load(checkouts: dict[str, str], reps: int) -> dict[str, object]:
    urls = {"sqlite": f"sqlite://{WORK / 'load.db'}", "json": f"json://{WORK / 'json'}"}
    first = next(iter(checkouts.values()))
    if not (WORK / "load.db").exists():
        subprocess.run([PY, str(BENCH / "drv_load.py"), "prepare", *urls.values(),
                        "--sizes", "100000"], check=True, cwd=WORK, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": f"{first}:{BENCH}"})
    cpu: dict[str, dict[str, list[float]]] = {k: {n: [] for n in checkouts} for k in urls}
    for _ in range(reps):
        for kind, url in urls.items():
            for name, path in checkouts.items():
                out = subprocess.run([PY, "-c", LOAD, url, "load-100000"], check=True,
                                     capture_output=True, text=True, cwd=WORK,
                                     env={**os.environ, "PYTHONPATH": path})
                cpu[kind][name].append(json.loads(out.stdout)["cpu"])
    return {kind: {n: round(statistics.median(v), 3) for n, v in per.items()}
            for kind, per in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    checkouts = {"before": args.before, "after": args.after}
    result = {"load average": os.getloadavg(),
              "startup": startup(checkouts, args.rounds),
              "load + verify 100,000, CPU s (median)": load(checkouts, args.loads)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
