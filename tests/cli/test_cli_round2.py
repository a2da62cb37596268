"""Daily driver, round 2 (issue 28): what users reach for first, through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_helpers import cli_env, invoke, replay_json

from chatstate.ops import templates
from chatstate.testing import FakeModel


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a user whose config directory is under tmp_path."""
    env = cli_env(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    monkeypatch.delenv(templates.ENV_DIR, raising=False)
    return env


# -- model options on the command line -----------------------------------------------------


def test_ask_stores_temperature_max_tokens_and_o_options_with_the_turn(
        tmp_path: Path, home: dict[str, str]) -> None:
    store = f"json://{tmp_path}/s"
    with FakeModel(reply_words=3) as fake:
        env = {**home, "CHATSTATE_BASE_URL": fake.base_url, "CHATSTATE_API_KEY": "none"}
        result = invoke(["ask", "--id", "o", "--temperature", "0.3", "--max-tokens", "50",
                         "-o", "top_p", "0.9", "-o", "stop", '["END"]', "-o", "user", "me",
                         "hi"], store=store, env=env)
    assert result.code == 0, result.err
    user = replay_json(store, "o")["messages"][0]
    assert user["params"] == {"temperature": 0.3, "max_tokens": 50, "top_p": 0.9,
                              "stop": ["END"], "user": "me"}


def test_command_line_options_win_over_the_template_and_a_template_needs_no_system(
        tmp_path: Path, home: dict[str, str]) -> None:
    store = f"json://{tmp_path}/s"
    saved = invoke(["templates", "save", "cool", "--param", "temperature=0.1",
                    "--param", "seed=7"], env=home)
    assert saved.code == 0, saved.err
    with FakeModel(reply_words=3) as fake:
        env = {**home, "CHATSTATE_BASE_URL": fake.base_url, "CHATSTATE_API_KEY": "none"}
        result = invoke(["ask", "-t", "cool", "--id", "t", "--temperature", "0.9", "hi"],
                        store=store, env=env)
    assert result.code == 0, result.err
    messages = replay_json(store, "t")["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]  # no empty system message
    assert messages[0]["params"] == {"temperature": 0.9, "seed": 7}


def test_o_without_a_usable_key_is_a_usage_error_and_stores_nothing(
        tmp_path: Path, home: dict[str, str]) -> None:
    store = f"json://{tmp_path}/s"
    result = invoke(["ask", "--model", "fake", "-o", "model", "x", "hi"], store=store,
                    env=home)
    assert result.code == 2
    assert "-o model is not a model parameter" in result.err
    assert invoke(["list", "--json"], store=store).json() == []
