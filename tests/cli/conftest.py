"""Fixtures the CLI tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_helpers import cli_env

from chatstate.ops import templates


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a user whose config directory is under tmp_path."""
    env = cli_env(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    monkeypatch.delenv(templates.ENV_DIR, raising=False)
    return env
