"""The oldest supported framework versions (the extras' lower bounds) pass the same tests.

The project venv has the newest (the dev extra pins them); this builds a cached venv
with openai-agents 0.21.0 and langchain-core 1.0.0 and chatstate (editable) and runs
the ported upstream tests and the LangChain tests there, on json and sqlite (the s3
store is the same code path above the store, and moto lives in the project venv).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from support import ROOT
from support.venvs import cached_venv

OLDEST = ["openai-agents==0.21.0", "langchain-core==1.0.0"]
TESTS = [f"tests/integrations/test_{name}.py" for name in (
    "agents_upstream_session", "agents_upstream_limit", "agents_upstream_sqlalchemy",
    "agents_upstream_simple", "agents_session", "langchain_history")]


@pytest.mark.slow
def test_oldest_supported_versions_pass_the_ported_tests() -> None:
    bin_dir = cached_venv("integrations-oldest", ["-e", str(ROOT), *OLDEST, "pytest>=8",
                                                  "pytest-asyncio>=0.24"],
                          tier="oldest framework versions")
    versions = subprocess.run(
        [str(bin_dir / "python"), "-c", "from importlib.metadata import version as v; "
         "print(v('openai-agents'), v('langchain-core'))"],
        capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert versions == ["0.21.0", "1.0.0"]
    # The s3 tier is deliberately not run here (see above), so it is not required either.
    env = {k: v for k, v in os.environ.items() if k != "CHATSTATE_REQUIRE_TIERS"}
    proc = subprocess.run(
        [str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", "-k", "not s3", *TESTS],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False, env=env)
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0, tail + proc.stderr[-2000:]
    assert " passed" in tail
    assert "failed" not in tail
