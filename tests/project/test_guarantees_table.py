"""docs/guarantees.md's table is made from the ``@pytest.mark.invariant`` markers.

scripts/gen-guarantees writes it; this regenerates it in memory and compares, the way
tests/cli/test_cli_help.py checks scripts/gen-help. Every invariant has a proof, and a
marker that names no invariant fails collection (tests/conftest.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.tiers import need

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen-guarantees"
DOC = ROOT / "docs" / "guarantees.md"


def load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("gen_guarantees", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load_script()


@pytest.fixture(scope="module")
def proofs() -> list[dict[str, Any]]:
    """What pytest collects as proofs (in a process of its own: a pytest run inside this one)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--proofs"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    # a module whose extra is missing: its markers cannot be seen
    need("guarantees-table", not found["skipped"], "the table cannot be checked without "
         "every module: " + "; ".join(f"{path}: {why}" for path, why in found["skipped"]))
    result: list[dict[str, Any]] = found["proofs"]
    return result


def test_the_committed_table_is_made_from_the_markers(gen: ModuleType,
                                                      proofs: list[dict[str, Any]]) -> None:
    committed = DOC.read_text(encoding="utf-8")
    assert gen.rewrite(committed, gen.render(proofs)) == committed, \
        "docs/guarantees.md's table is stale: run scripts/gen-guarantees"


def test_every_invariant_has_a_proof(gen: ModuleType, proofs: list[dict[str, Any]]) -> None:
    assert set(gen.GUARANTEES) == set(range(1, 11))
    assert gen.unproved(proofs) == [], "mark a test that proves it @pytest.mark.invariant(N)"


def test_a_marker_that_names_no_invariant_fails_collection(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(  # the suite's own check, alone
        "import runpy\n"
        f"pytest_collection_modifyitems = runpy.run_path({str(ROOT / 'tests' / 'conftest.py')!r})"
        "['pytest_collection_modifyitems']\n")
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.invariant(3, 4)\ndef test_good():\n    pass\n\n"
        "@pytest.mark.invariant(11)\ndef test_eleven():\n    pass\n\n"
        "@pytest.mark.invariant()\ndef test_none():\n    pass\n\n"
        "@pytest.mark.invariant(2)\n@pytest.mark.invariant(5)\ndef test_stacked():\n    pass\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\n@pytest.mark.invariant('1')\n"
        "def test_text(n):\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:randomly", "-p", "no:cacheprovider", "-p", "no:xdist"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "test_marked.py::" in line]
    named = [re.search(r"test_marked\.py::(\w+) ", line) for line in lines]
    assert [m and m[1] for m in named] == [
        "test_eleven", "test_none", "test_stacked", "test_text"], done.stderr
    assert "invariant(11) is not a list of distinct invariant numbers" in lines[0]
    assert "the invariants are 1-10 (DESIGN.md)" in lines[0]
    assert "more than one invariant marker" in lines[2]
    assert "invariant('1')" in lines[3]
