"""`python -m bench.faults` (the closing note's fault figures) at a tiny size: it prints the
table, every store's row shows faults fired and acknowledged messages, and none lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.pgserver import pg_bin
from support.tiers import need, need_s3

ROOT = Path(__file__).resolve().parents[2]
HEADER = ["store", "fault kind", "trials", "faults fired", "acknowledged", "lost"]

pytestmark = pytest.mark.slow


def test_fault_runs_print_the_table_and_lose_nothing() -> None:
    need_s3()
    need("postgresql", pg_bin() is not None, "PostgreSQL server binaries not installed")
    proc = subprocess.run([sys.executable, "-m", "bench.faults", "--trials", "2", "--seed", "7"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [c.strip() for c in lines[0].split("|")] == HEADER, proc.stdout
    rows = [[c.strip() for c in line.split("|")] for line in lines[2:]]
    assert [r[0] for r in rows] == ["json", "sqlite", "s3", "postgresql"], proc.stdout
    for store, kind, trials, fired, acked, lost in rows:
        assert kind == "kill -9 writer"
        assert (trials, fired) == ("2", "2"), store
        assert int(acked) > 0, store
        assert lost == "0", store
