"""npm packages the suite drives (MCP servers, Codex CLI, Claude Code), installed once into
a cached prefix.

Like ``venvs.py``: the prefix lives in the durable test cache
(``${XDG_CACHE_HOME:-~/.cache}/chatstate-tests/npm``), keyed by the package
list, so a second run reuses it. Without node/npm, or when the registry cannot
be reached, the caller skips (or, with ``CHATSTATE_REQUIRE_TIERS=1``, fails)
with the reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.venvs import cache_root


def _missing(reason: str) -> None:
    if os.environ.get("CHATSTATE_REQUIRE_TIERS", "").strip().lower() in (
            "1", "true", "yes", "on"):
        pytest.fail(reason)
    pytest.skip(reason=reason)


def cached_npm(packages: list[str], *, tier: str) -> Path:
    """The prefix's ``node_modules`` directory holding ``packages``; skip (or fail) if not."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            _missing(f"the {tier} tier needs {tool} on PATH (apt-get install nodejs npm)")
    key = hashlib.sha256("\n".join(packages).encode()).hexdigest()[:12]
    prefix = cache_root().parent / "npm" / key
    done = prefix / ".installed"
    if not done.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
             "--loglevel=error", *packages], capture_output=True, text=True, timeout=900,
            check=False)
        if proc.returncode != 0:
            _missing(f"the {tier} tier needs {' '.join(packages)} from npm, which could not "
                     f"be installed: {proc.stderr.strip().splitlines()[-1:]}")
        done.write_text("\n".join(packages) + "\n")
    return prefix / "node_modules"


def npm_bin(node_modules: Path, package: str) -> list[str]:
    """The command that runs ``package``'s main script with node."""
    import json

    meta = json.loads((node_modules / package / "package.json").read_text())
    entry = meta.get("bin")
    script = next(iter(entry.values())) if isinstance(entry, dict) else entry
    return ["node", str(node_modules / package / str(script))]


def npm_bin_dir(packages: list[str], *, tier: str) -> Path:
    """The prefix's ``node_modules/.bin`` (the packages' commands), installed as above."""
    return cached_npm(packages, tier=tier) / ".bin"
