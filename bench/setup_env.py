"""The comparison virtualenv (bench/.venv) and the description of this machine."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from .common import BENCH, COMPARE_PY, COMPARE_VENV, PROJECT_PY, WORK, log

REQUIREMENTS = BENCH / "requirements-compare.txt"
STAMP = COMPARE_VENV / ".bench-requirements.sha256"


def ensure_compare_venv() -> float:
    """Create or update bench/.venv from requirements-compare.txt; seconds spent."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if COMPARE_PY.exists() and STAMP.exists() and STAMP.read_text().strip() == digest:
        return 0.0
    t0 = time.perf_counter()
    if not COMPARE_PY.exists():
        log(f"creating {COMPARE_VENV} for the comparison libraries")
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(COMPARE_VENV)], check=True)
        subprocess.run([str(COMPARE_PY), "-m", "pip", "install", "--quiet", "--upgrade",
                        "pip"], check=True)
    log(f"installing {REQUIREMENTS.name} into {COMPARE_VENV} (pip)")
    subprocess.run([str(COMPARE_PY), "-m", "pip", "install", "--quiet", "-r",
                    str(REQUIREMENTS)], check=True)
    STAMP.write_text(digest + "\n")
    return time.perf_counter() - t0


def _mount(path: Path) -> tuple[str, str, str, str]:
    """(mount point, fstype, source device, options) of the mount holding ``path``."""
    best = ("", "?", "?", "")
    real = str(path.resolve())
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, right = line.split(" - ", 1)
            fields, tail = left.split(), right.split()
            point = fields[4]
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, tail[0], tail[1], fields[5])
    return best


def _disk(source: str) -> str:
    name = Path(source).name
    block = Path("/sys/block") / name
    if not block.exists():
        return source
    rotational = (block / "queue" / "rotational").read_text().strip()
    size = int((block / "size").read_text()) * 512 / 1e9
    model = ""
    for f in ("device/model", "device/vendor"):
        if (block / f).exists():
            model = (block / f).read_text().strip() or model
    kind = "rotational flag" if rotational == "1" else "non-rotational"
    if model == "0x1af4":  # the virtio vendor id: a virtual disk, its flag says little
        model = "virtio virtual disk"
    return f"{source} ({model or 'disk'}, {size:.0f} GB, kernel {kind} {rotational})"


def _cpu() -> str:
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _version(py: Path, *packages: str) -> str:
    code = ("import importlib.metadata as m, sys; print(sys.version.split()[0], *(f'{p} '"
            "+ m.version(p) for p in sys.argv[1:]), sep=', ')")
    out = subprocess.run([str(py), "-c", code, *packages], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()[-200:]


def describe() -> list[tuple[str, str]]:
    point, fstype, source, options = _mount(WORK)
    load = os.getloadavg()
    return [
        ("date", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", f"{_cpu()}, {os.cpu_count()} cores"),
        ("memory", f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} "
                   "GiB"),
        ("kernel", f"{platform.system()} {platform.release()}"),
        ("work dir", f"bench/work on {fstype} at {point} ({options}), device {_disk(source)}"),
        ("/tmp", "same device as bench/work" if os.stat("/tmp").st_dev == os.stat(WORK).st_dev
         else "another device"),
        ("load average at start", f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other work "
                                  "shares this machine)"),
        ("project venv", _version(PROJECT_PY, "chatstate", "openai", "pydantic")),
        ("comparison venv", _version(COMPARE_PY, "langchain-community", "langchain-core",
                                     "sqlalchemy", "openai-agents", "llm", "sqlite-utils")),
        ("SQLite", _sqlite_version()),
    ]


def _sqlite_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version
