"""Issue 28, round 2: misleading messages and exit codes, through the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.cli_helpers import cli_env, run_cli


def test_chat_with_piped_input_that_is_not_utf8_exits_non_zero(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path}/c.db"
    result = run_cli(["chat", "--model", "fake", "--raw"], cli_env(tmp_path), store=store,
                     input=b"hi\xff\n")
    assert "not valid UTF-8" in result.err
    assert result.code == 1, result.err


def test_chat_with_piped_input_that_works_exits_zero(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path}/c.db"
    result = run_cli(["chat", "--model", "fake", "--raw"], cli_env(tmp_path), store=store,
                     input=b"hello\n")
    assert result.code == 0, result.err


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_dev_shm_refusal_gives_its_reason_once(tmp_path: Path) -> None:
    result = run_cli(["list"], cli_env(tmp_path), store="sqlite:///dev/shm/chatstate-t28.db")
    assert result.code != 0
    assert "refusing store" in result.err
    assert result.err.count("lives in memory") == 1, result.err
