"""Root pytest hook: give every run its own scratch base on a disk the guard calls durable.

pytest's default tmp_path lives under /tmp, which the durability guard rightly
refuses, and the checkout's own disk may be no better (a clone under /tmp). So
``tests/support/scratch.py`` asks the guard, candidate by candidate, and each run gets a
folder of its own named after the boot id, pid namespace and pid; a fixed
``--basetemp`` would let two concurrent runs delete each other's files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent
sys.path.insert(0, str(CHECKOUT / "tests"))

from support import scratch  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp or hasattr(config, "workerinput"):
        return  # given explicitly, or an xdist worker (it derives its own from the controller)
    try:
        base = scratch.choose(CHECKOUT)
    except scratch.NoScratch as exc:
        raise pytest.UsageError(str(exc)) from None
    scratch.clean_dead_runs(base)
    config.option.basetemp = str(base / scratch.run_name())
