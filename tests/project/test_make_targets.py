"""The quick start's two targets install what each needs: `make demo` the package alone,
`make test` the extras and the test tooling."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from support import ROOT


def planned(target: str) -> list[str]:
    """The pip installs ``make TARGET`` would run on a fresh clone (-B: as if nothing is built)."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed: the README's quick start needs it")
    done = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return [line for line in done.stdout.splitlines()
            if "pip install" in line and "--upgrade pip" not in line]


def test_make_demo_installs_the_package_without_extras() -> None:
    installs = planned("demo")
    assert installs, "make demo installs nothing"
    assert all(line.rstrip().endswith(" -e .") for line in installs), installs


def test_make_test_installs_the_test_tooling() -> None:
    installs = planned("test")
    assert any("dev]" in line for line in installs), installs
