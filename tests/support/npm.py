"""npm packages the suite drives (Codex CLI, Claude Code), installed once into an npm prefix
in the durable test cache (``${XDG_CACHE_HOME:-~/.cache}/chatstate-tests/npm``), keyed by
what is installed. Where npm or the registry cannot be had the caller skips (or, with
``CHATSTATE_REQUIRE_TIERS=1``, fails) with the reason, as ``venvs.cached_venv`` does."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.venvs import cache_root


def _give_up(reason: str) -> None:
    if os.environ.get("CHATSTATE_REQUIRE_TIERS", "").strip().lower() in ("1", "true", "yes",
                                                                         "on"):
        pytest.fail(reason)
    pytest.skip(reason=reason)


def npm_bin(packages: list[str], *, tier: str) -> Path:
    """The ``node_modules/.bin`` directory of a prefix holding ``packages``."""
    npm = shutil.which("npm")
    if npm is None:
        _give_up(f"the {tier} tier needs npm (Node.js), which is not on PATH")
        raise AssertionError("unreachable")
    key = hashlib.sha256("\n".join(packages).encode()).hexdigest()[:12]
    prefix = cache_root().parent / "npm" / key
    done = prefix / ".installed"
    if not done.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit",
                               "--no-fund", *packages], capture_output=True, text=True,
                              timeout=900, check=False)
        if proc.returncode != 0:
            _give_up(f"the {tier} tier needs {' '.join(packages)}, which could not be "
                     f"installed: {proc.stderr.strip().splitlines()[-1:]}")
        done.write_text("\n".join(packages) + "\n")
    return prefix / "node_modules" / ".bin"
