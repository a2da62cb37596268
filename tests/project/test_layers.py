"""The layers hold: who may import what.

- code outside ``chatstate.stores`` uses the stores' public helpers, never their
  private modules (``stores._files``, ``stores._s3doc``, ...);
- code outside ``chatstate.adapter`` uses its public names (``chatstate.adapter``,
  ``adapter.dialects.chat_completions``, ...), never its private modules or names;
- the production CLI does not import ``chatstate.testing``: ``ask`` against a real
  OpenAI-compatible endpoint (the fake server, reached over HTTP like any other)
  runs without it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT
from support.cli_helpers import API_KEY, cli_env

from chatstate.testing import FakeModel

PACKAGE = ROOT / "chatstate"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level] if node.level else []
            if node.level and path.name != "__init__.py":
                base = parts[:len(parts) - node.level]
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_nothing_outside_the_stores_imports_their_private_modules() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "stores"):
            continue
        for line, name in _imports(path):
            if name.startswith("chatstate.stores._"):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name}")
    assert offenders == []


@pytest.mark.usefixtures("no_model_settings_from_env")
def test_ask_against_a_real_endpoint_never_imports_the_testing_package(tmp_path: Path) -> None:
    with FakeModel(reply_words=3) as fake:
        env = cli_env(tmp_path, CHATSTATE_API_KEY=API_KEY)
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "chatstate", "--store",
             f"sqlite://{tmp_path}/s.db", "ask", "--base-url", fake.base_url, "--model",
             "fake-model", "hello there"], capture_output=True, text=True, env=env,
            timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "hello there" in proc.stdout
        assert len(fake.request_log) == 1  # the reply came over HTTP from the endpoint
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "chatstate.cli" in imported  # -X importtime did report the imports
    assert [m for m in imported if m.startswith("chatstate.testing")] == []


def test_nothing_outside_the_adapter_imports_its_private_modules() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "adapter"):
            continue
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[:2] == ["chatstate", "adapter"] and any(
                    p.startswith("_") for p in parts[2:]):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name}")
    assert offenders == []
