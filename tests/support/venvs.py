"""Virtualenvs of other programs the suite drives (llm, ...), built once and cached.

They live in the durable test cache (``${XDG_CACHE_HOME:-~/.cache}/chatstate-tests``),
keyed by what is installed, so a second run reuses them. Installing needs the
package registry; where it cannot be reached the caller skips (or, with
``CHATSTATE_REQUIRE_TIERS=1``, fails) with the reason.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "chatstate-tests" / "venvs"


def cached_venv(name: str, requirements: list[str], *, tier: str) -> Path:
    """The bin/ directory of a venv holding ``requirements``; skip (or fail) if it can't be had."""
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    venv = cache_root() / f"{name}-{key}"
    done = venv / ".installed"
    if not done.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        base = getattr(sys, "_base_executable", sys.executable)
        steps = [[base, "-m", "venv", "--clear", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                  "--disable-pip-version-check", *requirements]]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True, timeout=600,
                                  check=False)
            if proc.returncode != 0:
                reason = (f"the {tier} tier needs {' '.join(requirements)}, which could not "
                          f"be installed: {proc.stderr.strip().splitlines()[-1:]}")
                if os.environ.get("CHATSTATE_REQUIRE_TIERS", "").strip().lower() in (
                        "1", "true", "yes", "on"):
                    pytest.fail(reason)
                pytest.skip(reason=reason)
        done.write_text("\n".join(requirements) + "\n")
    return venv / "bin"
