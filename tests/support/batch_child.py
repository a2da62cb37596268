"""Helpers for the batch tests: inputs, the ledger as the test sees it, and runner processes.

Every record's prompt starts with its id and a bar (``PROMPT``), so the fake
model's request log says which record each request was for.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

PROMPT = "{id}|{text}"


def write_jsonl(path: Path, n: int, *, prefix: str = "rec", extra: dict[str, str] | None = None,
                ) -> list[str]:
    """``n`` records rec-000... (plus ``extra`` id -> text); returns the ids in order."""
    records = {f"{prefix}-{i:03d}": f"text of record {i}" for i in range(n)}
    records.update(extra or {})
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in records.items()))
    return list(records)


def ledger_rows(path: Path) -> dict[str, dict[str, Any]]:
    """id -> row, read with a plain read-only connection (as an operator would)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return {r["id"]: dict(r) for r in db.execute("SELECT * FROM records")}
    finally:
        db.close()


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def calls_by_record(log: list[dict[str, Any]]) -> dict[str, list[float]]:
    """record id -> arrival times of the chat requests made for it."""
    calls: dict[str, list[float]] = defaultdict(list)
    for entry in log:
        if entry.get("path", "").endswith("/chat/completions"):
            user = [m for m in entry["messages"] if m.get("role") == "user"][-1]["content"]
            calls[user.split("|", 1)[0]].append(entry["time"])
    return dict(calls)


def run_args(source: Path, out: Path, base_url: str, *extra: str) -> list[str]:
    return ["batch", "run", str(source), "--prompt", PROMPT, "--out", str(out),
            "--base-url", base_url, "--model", "fake-model", *extra]


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``python -m chatstate ARGS`` as a child process, output captured."""
    return subprocess.Popen([sys.executable, "-m", "chatstate", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
