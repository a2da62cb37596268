"""kill -9 against chat-history memories: chatstate's vs LangChain's FileChatMessageHistory.

    .venv/bin/python -m bench.memory_kill9 [--trials 200] [--seed 7] [--file-python PY]
                                           [--out bench/memory_kill9.md]

Runs bench/kill9_history.py for chatstate's ChatstateChatMessageHistory on the json
and sqlite stores (project python) and for FileChatMessageHistory (``--file-python``,
default bench/.venv, created from requirements-compare.txt), then writes the tallies as
a markdown table. Work directories are under bench/work/ (durable disk, never /tmp).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
SCRIPT = BENCH / "kill9_history.py"
SYSTEMS = [("chatstate-json", "ChatstateChatMessageHistory, json store"),
           ("chatstate-sqlite", "ChatstateChatMessageHistory, sqlite store"),
           ("langchain-file", "LangChain FileChatMessageHistory (langchain-community)")]


def run(system: str, python: str, work: Path, trials: int, seed: int) -> dict[str, Any]:
    target = work / system
    shutil.rmtree(target, ignore_errors=True)
    out = subprocess.run([python, str(SCRIPT), system, str(target), "--trials", str(trials),
                          "--seed", str(seed)], capture_output=True, text=True, check=False,
                         timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{system}: kill9_history.py failed:\n{out.stderr[-2000:]}")
    tally: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return tally


def table(tallies: list[dict[str, Any]], seed: int) -> str:
    names = dict(SYSTEMS)
    rows = ["| memory | trials | batches acknowledged | unreadable afterwards | "
            "half a batch kept | trials that lost an acknowledged batch |",
            "|:---|---:|---:|---:|---:|---:|"]
    for t in tallies:
        rows.append(f"| {names[t['system']]} | {t['trials']} | {t['acked']} | "
                    f"{t['unreadable']} | {t['torn']} | {t['lost']} |")
    notes = [f"- {names[t['system']]}: {n}" for t in tallies for n in t["notes"]]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "# kill -9 against chat-history memories", "",
        f"`python -m bench.memory_kill9 --trials {tallies[0]['trials']} --seed {seed}`, "
        f"{stamp}. Each trial forks a writer that calls `add_messages([human, ai])` in a "
        "loop and reports each return; the writer is SIGKILLed after a random number of "
        "returns plus 0-20 ms, and the history is read back with a new object.", "",
        *rows, "", *(["Sample errors:", "", *notes, ""] if notes else [])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--file-python", help="python with langchain-community "
                        "(default: bench/.venv, created if missing)")
    parser.add_argument("--work", type=Path, default=BENCH / "work" / "memory_kill9")
    parser.add_argument("--out", type=Path, default=BENCH / "memory_kill9.md")
    args = parser.parse_args(argv)
    file_python = args.file_python
    if file_python is None:
        from .common import COMPARE_PY
        from .setup_env import ensure_compare_venv

        ensure_compare_venv()
        file_python = str(COMPARE_PY)
    tallies = [run(system, sys.executable if system.startswith("chatstate") else file_python,
                   args.work.resolve(), args.trials, args.seed) for system, _ in SYSTEMS]
    text = table(tallies, args.seed)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
