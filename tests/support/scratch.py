"""Where the test suite keeps its files: the first candidate the durability guard calls durable.

Every store a test creates goes through the durability guard, which refuses
/tmp and other ephemeral places, so the suite cannot use pytest's default base
under /tmp, nor assume that the checkout's own disk is durable (a clone under
/tmp is not). The candidates, in order:

1. ``$CHATSTATE_TEST_TMP``
2. ``<checkout>/.pytest-tmp``
3. ``${XDG_CACHE_HOME:-~/.cache}/chatstate-tests``

The first one that ``chatstate.durable.guard.inspect`` calls durable, and that can
be created, wins. If none does, ``NoScratch`` carries one line saying why.

Each run gets ``run-<boot id>-<pid namespace>-<pid>`` below the base, so runs in
other containers sharing the disk (same boot id, other pid namespace) keep
their folders: a run removes only folders of its own boot and pid namespace
whose process is gone.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from chatstate.durable.guard import boot_id, inspect

ENV = "CHATSTATE_TEST_TMP"


class NoScratch(Exception):
    """No candidate is durable; the message is one line naming each and why."""


def candidates(checkout: Path, environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    """(label, path) for each candidate, in the order they are tried."""
    out: list[tuple[str, Path]] = []
    if environ.get(ENV):
        out.append((ENV, Path(environ[ENV]).expanduser()))
    out.append(("checkout", checkout / ".pytest-tmp"))
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    cache = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") \
        else home / ".cache"
    out.append(("cache", cache / "chatstate-tests"))
    return out


def refusal(path: Path) -> str | None:
    """Why ``path`` cannot be the scratch base, or None if it can."""
    report = inspect(path, probe=False)
    if report.verdict != "durable":
        where = f"{report.fstype or '?'} at {report.mount_point or '?'}"
        first = report.reasons[0] if report.reasons else ""
        return f"{path} is {report.verdict} ({where}; {first.rstrip('.')})"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{path} cannot be created ({exc.strerror or exc})"
    return None


def choose(checkout: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The scratch base: the first durable candidate (see the module docstring)."""
    env = os.environ if environ is None else environ
    refused = []
    for label, path in candidates(checkout, env):
        why = refusal(path.absolute())
        if why is None:
            return path.absolute()
        refused.append(f"{label}: {why}")
    raise NoScratch("chatstate tests: no durable scratch directory; " + "; ".join(refused)
                    + f". Set {ENV} to a directory on a disk.")


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]") or "0"
    except OSError:
        return "0"


def run_prefix() -> str:
    """What the folders of runs on this boot and in this pid namespace start with."""
    boot = (boot_id() or "noboot").replace("-", "")[:12]
    return f"run-{boot}-{pid_namespace()}-"


def run_name() -> str:
    """This run's folder name: boot id, pid namespace and pid."""
    return f"{run_prefix()}{os.getpid()}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_dead_runs(base: Path) -> list[Path]:
    """Remove folders of runs of this boot and pid namespace whose process is gone."""
    prefix = run_prefix()
    removed = []
    for old in base.glob(prefix + "*"):
        pid = old.name.removeprefix(prefix)
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed
