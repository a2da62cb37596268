"""A failed first attempt (a wrong URL or key) leaves no one-message conversation behind,
unless asked (--keep-failed); a failure in a conversation that already had turns keeps
the message, to be retried."""

from __future__ import annotations

from pathlib import Path

from support.cli_helpers import cli_env, invoke, replay_json

DEAD = ["--base-url", "http://127.0.0.1:9/v1"]


def test_a_failed_first_message_leaves_nothing(tmp_path: Path) -> None:
    store = f"json://{tmp_path}/s"
    env = {**cli_env(tmp_path), "CHATSTATE_MAX_RETRIES": "0"}
    done = invoke(["ask", *DEAD, "hello"], store=store, env=env)
    assert done.code == 1
    assert "Nothing was kept" in done.err and "--keep-failed" in done.err
    assert invoke(["list", "--json"], store=store, env=env).out.strip() == "[]"


def test_a_wrong_key_leaves_nothing_either(tmp_path: Path) -> None:
    from chatstate.testing import FakeModel

    store = f"json://{tmp_path}/s"
    with FakeModel() as fake:
        fake.fail_next(status=401)  # the provider refuses the key
        env = cli_env(tmp_path)
        done = invoke(["ask", "--base-url", fake.base_url, "hello"], store=store, env=env)
    assert done.code == 1, done.err
    assert "Nothing was kept" in done.err
    assert invoke(["list", "--json"], store=store, env=env).out.strip() == "[]"


def test_a_provider_outage_keeps_the_message_for_a_retry(tmp_path: Path) -> None:
    from chatstate.testing import FakeModel

    store = f"json://{tmp_path}/s"
    with FakeModel() as fake:
        fake.fail_next(status=500, times=5)
        env = {**cli_env(tmp_path), "CHATSTATE_MAX_RETRIES": "0"}
        done = invoke(["ask", "--id", "k", "--base-url", fake.base_url, "hello"], store=store,
                      env=env)
    assert done.code == 1, done.err
    assert "--retry" in done.err and "Nothing was kept" not in done.err
    assert [m["role"] for m in replay_json(store, "k")["messages"]] == ["user"]


def test_keep_failed_keeps_it_for_a_retry(tmp_path: Path) -> None:
    store = f"json://{tmp_path}/s"
    env = {**cli_env(tmp_path), "CHATSTATE_MAX_RETRIES": "0"}
    done = invoke(["ask", "--id", "k", "--keep-failed", *DEAD, "hello"], store=store, env=env)
    assert done.code == 1
    assert "--retry" in done.err
    assert [m["role"] for m in replay_json(store, "k")["messages"]] == ["user"]


def test_a_failure_later_in_a_conversation_keeps_the_message(tmp_path: Path) -> None:
    store = f"json://{tmp_path}/s"
    env = {**cli_env(tmp_path), "CHATSTATE_MAX_RETRIES": "0"}
    assert invoke(["ask", "--model", "fake", "--id", "k", "hi"], store=store, env=env).code == 0
    done = invoke(["ask", "--id", "k", *DEAD, "and then?"], store=store, env=env)
    assert done.code == 1
    assert "Nothing was kept" not in done.err
    assert [m["role"] for m in replay_json(store, "k")["messages"]] == \
        ["user", "assistant", "user"]
