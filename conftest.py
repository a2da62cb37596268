"""Root pytest hook: give every run its own temp base under the checkout.

pytest's default tmp_path lives under /tmp, which the durability guard rightly
refuses; a fixed ``--basetemp`` would let two concurrent runs delete each
other's files. So each run gets ``.pytest-tmp/run-<pid>`` on the checkout's
disk, and bases of runs whose process is gone are removed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parent / ".pytest-tmp"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp or hasattr(config, "workerinput"):
        return  # given explicitly, or an xdist worker (it derives its own from the controller)
    ROOT.mkdir(exist_ok=True)
    for old in ROOT.glob("run-*"):
        pid = old.name.removeprefix("run-")
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(ROOT / f"run-{os.getpid()}")
