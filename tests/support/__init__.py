"""What the tests share: servers, children, fault tools, tiers, scratch.

``SUPPORT`` is this folder (the child scripts live here), ``TESTS`` the test tree,
``ROOT`` the checkout."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
