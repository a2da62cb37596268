"""Scenario 4: start-up time of the CLI against `python -c pass` and `llm --version`.

With hyperfine installed, each command is measured by ``hyperfine -N`` (no
shell) in short rounds that rotate over the commands, so drift hits all alike;
otherwise by a loop of our own with the same rounds. ``chatstate ask
--base-url LOCAL hi`` is a whole turn against a zero-latency local endpoint
(the fake model in its own process): open the sqlite store under bench/work
(durability guard, recovery), persist, stream, commit.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from .common import (
    COMPARE_VENV,
    PROJECT_PY,
    WORK,
    Section,
    Target,
    log,
    median,
    ms,
    p99,
    ratio,
    table,
)

PASS, HELP, ASK, LLM = ("python -c pass", "chatstate --help",
                        "chatstate ask --base-url LOCAL hi", "llm --version")
OPENAI = "python -c 'import openai'"  # the SDK alone (a project dependency, same interpreter)
# what any `ask` must import: the CLI framework, the HTTP client, the transcript records
FLOOR = "python -c 'import click, httpx2, chatstate.core.transcript'"


def _commands(base_url: str) -> dict[str, list[str]]:
    exe = str(PROJECT_PY.with_name("chatstate"))
    return {PASS: [str(PROJECT_PY), "-c", "pass"], HELP: [exe, "--help"],
            ASK: [exe, "ask", "--base-url", base_url, "hi"],
            FLOOR: [str(PROJECT_PY), "-c", "import click, httpx2, chatstate.core.transcript"],
            LLM: [str(COMPARE_VENV / "bin" / "llm"), "--version"],
            OPENAI: [str(PROJECT_PY), "-c", "import openai"]}


def _byte_compile() -> None:
    """Write the .pyc files of chatstate and of both venvs before timing, so no command
    pays for compiling on its first runs (what an installed package has from pip)."""
    import chatstate

    for py, where in ((PROJECT_PY, Path(chatstate.__file__).parent),
                      (COMPARE_VENV / "bin" / "python", COMPARE_VENV / "lib")):
        subprocess.run([str(py), "-m", "compileall", "-q", "-j", "0", str(where)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def _hyperfine(cmd: list[str], runs: int, env: dict[str, str], out: Path,
               warmup: int) -> list[float]:
    subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs",
                    str(runs),
                    "--export-json", str(out), "--", shlex.join(cmd)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=WORK)
    times: list[float] = json.loads(out.read_text())["results"][0]["times"]
    return times


def _loop(cmd: list[str], runs: int, env: dict[str, str], warmup: int) -> list[float]:
    for _ in range(warmup):
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, cwd=WORK)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, cwd=WORK)
        times.append(time.perf_counter() - t0)
    return times


def run(quick: bool) -> Section:
    rounds = 2 if quick else 4
    # the cheap commands get more runs per round than the ones that take a second or more
    runs = {PASS: 10, HELP: 10, ASK: 3, LLM: 3, FLOOR: 3, OPENAI: 3}
    work = WORK / "startup"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "CHATSTATE_STORE": f"sqlite://{work / 'ask.db'}"}
    tool = "hyperfine -N" if shutil.which("hyperfine") else "a Python loop (no hyperfine)"
    log(f"startup: {rounds} rounds with {tool}")
    _byte_compile()
    fake = subprocess.Popen([str(PROJECT_PY), "-m", "chatstate.testing.fake_server"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=WORK)
    try:
        assert fake.stdout is not None
        times = _measure(_commands(fake.stdout.readline().strip()), rounds, runs, env, tool,
                         work)
    finally:
        fake.terminate()
        fake.wait(10)
    return _report(times, tool, rounds)


def _measure(commands: dict[str, list[str]], rounds: int, runs: dict[str, int],
             env: dict[str, str], tool: str, work: Path) -> dict[str, list[float]]:
    names = list(commands)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            warmup = 1 if r < 2 else 0  # first two rounds: one warm-up run (caches, .pyc)
            if tool.startswith("hyperfine"):
                times[name] += _hyperfine(commands[name], runs[name], env, work / "hf.json",
                                          warmup)
            else:
                times[name] += _loop(commands[name], runs[name], env, warmup)
    return times


ASK_WHY = ("imports dominate: importing only click, httpx2 (with h11, anyio) and the "
           "transcript records, which any turn needs, takes {floor} of {anchor} in this "
           "run (the import-floor row)")


def _report(times: dict[str, list[float]], tool: str, rounds: int) -> Section:
    base = median(times[PASS])
    rows = [[f"`{n}`", ms(median(t)), ms(p99(t)), ratio(median(t) / base), len(t)]
            for n, t in times.items()]
    body = "\n\n".join([
        f"Wall time per process with {tool}, in {rounds} rounds rotating over the "
        "commands; median and p99 in ms. `chatstate ask` uses CHATSTATE_STORE=sqlite "
        "under bench/work and the fake model in its own process as a zero-latency local "
        "endpoint (LOCAL = its base URL): a whole turn with real store writes.",
        table(["command", "median ms", "p99 ms", "× python -c pass", "runs"], rows),
    ])
    help_ratio = median(times[HELP]) / base
    help_vs_llm = median(times[HELP]) / median(times[LLM])
    ask_vs_llm = median(times[ASK]) / median(times[LLM])
    ask_vs_openai = median(times[ASK]) / median(times[OPENAI])
    targets = [
        Target("startup", "`chatstate --help` < 3× `python -c pass`", ratio(help_ratio),
               help_ratio < 3, "" if help_ratio < 3 else "imports on the --help path"),
        Target("startup", "`chatstate --help` faster than `llm --version`",
               f"{ms(median(times[HELP]))} vs {ms(median(times[LLM]))} ms "
               f"({ratio(help_vs_llm)})", help_vs_llm < 1, ""),
        Target("startup", "`chatstate ask` (local endpoint) ≤ 0.25× `llm --version`",
               f"{ms(median(times[ASK]))} vs {ms(median(times[LLM]))} ms "
               f"({ratio(ask_vs_llm)})", ask_vs_llm <= 0.25, "" if ask_vs_llm <= 0.25 else
               ASK_WHY.format(floor=ratio(median(times[FLOOR]) / median(times[LLM])),
                              anchor="`llm --version`")),
        Target("startup", "`chatstate ask` (local endpoint) ≤ 0.40× `python -c 'import openai'`",
               f"{ms(median(times[ASK]))} vs {ms(median(times[OPENAI]))} ms "
               f"({ratio(ask_vs_openai)})", ask_vs_openai <= 0.40,
               "" if ask_vs_openai <= 0.40 else ASK_WHY.format(
                   floor=ratio(median(times[FLOOR]) / median(times[OPENAI])),
                   anchor="`import openai`")),
    ]
    return Section("4. Start-up", body, targets)
