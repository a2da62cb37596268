"""Chromium from the system's packages, driven by Playwright, for the browser tier.

Nothing is downloaded: Playwright's bundled driver launches ``/usr/bin/chromium``
(Debian's ``chromium`` package; ``scripts/test-prereqs`` installs it as root).
Without it, or without the ``playwright`` package, the tier skips saying so, and
fails under ``CHATSTATE_REQUIRE_TIERS=1``. Screenshots are kept as test artefacts in
``<scratch base>/artefacts/web`` (``artefacts``), which outlives the run's folder.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from support.tiers import need

CHROMIUM = os.environ.get("CHATSTATE_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def need_browser() -> None:
    """The browser tier: skip (or fail, when required) without Chromium or Playwright."""
    need("browser", importlib.util.find_spec("playwright") is not None,
         "the playwright package (pip install 'chatstate[dev]') is not installed")
    need("browser", os.access(CHROMIUM, os.X_OK),
         f"{CHROMIUM} is missing: apt-get install chromium (scripts/test-prereqs does, as "
         "root)")


def artefacts(config: pytest.Config, name: str) -> Path:
    """A folder for the run's screenshots, beside the run folders of the scratch base."""
    base = Path(str(config.option.basetemp)).parent
    out = base / "artefacts" / name
    out.mkdir(parents=True, exist_ok=True)
    return out
