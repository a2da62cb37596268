"""kill -9 against add_messages: chatstate's LangChain history loses and corrupts nothing
in 100 trials per store; LangChain's FileChatMessageHistory runs the same trials in the
same test run (its tally is reported, not asserted: it is the comparison)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is not installed "
                    "(chatstate[langchain])")

from support import ROOT
from support.venvs import cached_venv

SCRIPT = ROOT / "bench" / "kill9_history.py"
COMPARE = ["langchain-community==0.4.2", "langchain-core==1.8.3"]


def trials(python: str, system: str, work: Path, n: int) -> dict[str, object]:
    out = subprocess.run([python, str(SCRIPT), system, str(work / system), "--trials", str(n)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


@pytest.mark.invariant(4)
@pytest.mark.slow
@pytest.mark.parametrize("system", ["chatstate-json", "chatstate-sqlite"])
def test_chatstate_history_survives_100_kills(system: str, tmp_path: Path) -> None:
    tally = trials(sys.executable, system, tmp_path, 100)
    assert tally["trials"] == 100
    assert int(str(tally["acked"])) > 100  # the kills landed mid-run
    assert (tally["unreadable"], tally["torn"], tally["lost"]) == (0, 0, 0), tally


@pytest.mark.slow
def test_file_chat_message_history_same_trials_and_the_table(tmp_path: Path) -> None:
    """The comparison in the same run, and the bench script that writes the table."""
    python = cached_venv("langchain-community", COMPARE, tier="langchain comparison")
    tally = trials(str(python / "python"), "langchain-file", tmp_path, 100)
    assert tally["trials"] == 100
    print("FileChatMessageHistory:", tally)
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, "-m", "bench.memory_kill9", "--trials", "3",
                           "--file-python", str(python / "python"), "--work",
                           str(tmp_path / "bench"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = out.read_text()
    assert "| ChatstateChatMessageHistory, json store | 3 |" in table
    assert "FileChatMessageHistory" in table
