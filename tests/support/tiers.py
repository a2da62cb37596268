"""Test tiers that need something of the machine: skip where it is missing, or fail in CI.

    need("strace", shutil.which("strace") is not None, "strace is not installed")

Without ``CHATSTATE_REQUIRE_TIERS`` a tier that cannot run here skips, with its
reason, so a user without root or without FUSE still gets a green run that
says what it left out. ``.ci/run`` sets ``CHATSTATE_REQUIRE_TIERS=1``: CI has
root and every tool, so there a tier that cannot run is a failure, never a
quiet skip.

``S3_MISSING`` is the one allowed reason for the S3 store to be absent: its
optional dependency (obstore) or the moto server is not installed. Any other
failure to import ``chatstate.stores.s3.store`` or ``tests/support/s3server.py`` is left to
raise, and fails the suite.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest

REQUIRE_ENV = "CHATSTATE_REQUIRE_TIERS"
REQUIRED = os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def need(tier: str, available: bool, reason: str) -> None:
    """Return if ``tier`` can run; otherwise skip with ``reason``, or fail when required."""
    if available:
        return
    if REQUIRED:
        pytest.fail(f"the {tier} tier cannot run: {reason} ({REQUIRE_ENV} is set, so every "
                    "tier must run)", pytrace=False)
    pytest.skip(reason=f"{tier} tier: {reason}", allow_module_level=True)


def _s3_missing() -> str | None:
    try:
        importlib.import_module("obstore")  # the store imports it anyway
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "obstore":
            raise  # installed but broken: that fails the suite, it is no reason to skip
        return "obstore (pip install 'chatstate[s3]') is not installed"
    if importlib.util.find_spec("moto") is None:  # it runs in a server process of its own
        return "moto (pip install 'chatstate[dev]') is not installed"
    return None


S3_MISSING = _s3_missing()


def need_s3() -> None:
    """The S3 tier: skip (or fail, when required) only if its optional packages are missing."""
    need("s3", S3_MISSING is None, S3_MISSING or "")
