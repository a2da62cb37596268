"""Paths, statistics, markdown tables, targets, and the JSON-lines driver client."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "work"
PROJECT_PY = Path(sys.executable)
COMPARE_VENV = BENCH / ".venv"
COMPARE_PY = COMPARE_VENV / "bin" / "python"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1"}


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def p99(xs: Sequence[float]) -> float:
    """Nearest-rank 99th percentile: with fewer than 100 samples this is the maximum."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def ms(seconds: float) -> str:
    v = seconds * 1000
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def ratio(x: float) -> str:
    return f"{x:.2f}×" if x < 100 else f"{x:.0f}×"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table; ``align`` is one char per column, 'l' or 'r' (default: l then r)."""
    align = align or "l" + "r" * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


@dataclass
class Target:
    """One target (issues 8 and 16), as measured in this run."""

    scenario: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run
    why: str = ""

    def row(self) -> list[str]:
        verdict = "not run" if self.met is None else "**met**" if self.met else "**missed**"
        return [self.scenario, self.target, self.measured, verdict, self.why]


@dataclass
class Section:
    title: str
    body: str
    targets: list[Target] = field(default_factory=list)
    seconds: float = 0.0


class Driver:
    """A driver subprocess speaking JSON lines: one command in, one answer out."""

    def __init__(self, python: Path, script: str, args: Sequence[str],
                 env: dict[str, str] | None = None, wrap: Sequence[str] = ()) -> None:
        cmd = [*wrap, str(python), str(BENCH / script), *args]
        # DeprecationWarnings of the compared libraries are noise in the bench's output
        full_env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=WORK, env=full_env)
        self.name = " ".join(args[:2])

    def call(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"driver {self.name} died (exit {self.proc.wait()}) on {command}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"driver {self.name}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError):
                self.call(op="quit")
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)
