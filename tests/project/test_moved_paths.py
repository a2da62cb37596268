"""The 0.2 module paths still import, as the very modules they moved to, for one release."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from support import ROOT

from chatstate._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_moved_module_itself(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_from_imports_of_old_paths_work_in_a_fresh_process() -> None:
    code = ("from chatstate.content import content\n"
            "from chatstate.transcript import Message\n"
            "from chatstate.stores.fsutil import atomic_write\n"
            "from chatstate.session import Chat\n"
            "import chatstate.usage\n")
    proc = subprocess.run([sys.executable, "-c", code + "print(Message.__module__)"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "chatstate.core.transcript"


def test_nothing_inside_chatstate_imports_an_old_path() -> None:
    offenders = []
    for path in sorted((ROOT / "chatstate").rglob("*.py")):
        if path.name == "_moved.py":
            continue
        text = path.read_text()
        for old in MOVED:
            for form in (f"from {old} import", f"import {old}\n", f"import {old} "):
                if form in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {form.strip()}")
    assert offenders == []
