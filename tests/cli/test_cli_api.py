"""``--api`` (= CHATSTATE_API) picks the wire API of ``ask``; the offline fake speaks all
three, and one conversation continues through each in turn."""

from __future__ import annotations

from pathlib import Path

from support.cli_helpers import cli_env, run_cli

from chatstate.stores import open_store


def test_ask_continues_one_conversation_through_each_api(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    env = cli_env(tmp_path)
    for n, api in enumerate(("anthropic_messages", "responses", "chat_completions")):
        args = ["ask", "--offline", "--api", api, f"question {n}"]
        result = run_cli(args if n == 0 else [*args[:1], "-c", *args[1:]], env, store=url)
        assert result.code == 0, result.err
        assert f"Echo: question {n}" in result.out
    bad = run_cli(["ask", "--offline", "--api", "gopher", "x"], env, store=url)
    assert bad.code == 2 and "anthropic_messages" in bad.err
    store = open_store(url)
    try:
        (summary,) = store.list_conversations()
        conv = store.load(summary.id)
    finally:
        store.close()
    assert [m.role for m in conv.messages] == ["user", "assistant"] * 3
    assert conv.verify() is None
