"""Daily driver, round 2 (issue 28), what users reach for first: -f, models, config.toml,
quiet read-only commands, honest trimming, --no-log, /copy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_helpers import cli_env, invoke, replay_json

from chatstate.testing import FakeModel


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=2) as model:
        yield model


def env_for(tmp_path: Path, fake: FakeModel, **extra: str) -> dict[str, str]:
    return cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url,
                   CHATSTATE_API_KEY="sk-test-cli-0123456789abcdef",
                   CHATSTATE_CONFIG_DIR=str(tmp_path / "cfg"), **extra)


def chats(fake: FakeModel) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in fake.request_log if e["path"] == "/v1/chat/completions"]


def user_text(entry: dict) -> str:  # type: ignore[type-arg]
    content = entry["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(
        p.get("text", "") for p in content)


# -- -f PATH ------------------------------------------------------------------------------

def test_f_puts_files_dirs_globs_and_stdin_in_the_message(tmp_path: Path,
                                                          fake: FakeModel) -> None:
    (tmp_path / "notes.md").write_text("note body\n")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "a.py").write_text("print('a')\n")
    (src / "pkg" / "b.py").write_text("print('b')\n")
    (src / ".hidden").write_text("secret-ish\n")
    store = f"json://{tmp_path}/s"
    result = invoke(["ask", "-f", str(tmp_path / "notes.md"), "-f", str(src), "-f",
                     f"{tmp_path}/*.md", "-f", "-", "Summarise"], store=store,
                    input="from stdin\n", env=env_for(tmp_path, fake))
    assert result.code == 0, result.err
    sent = user_text(chats(fake)[-1])
    assert f'<file name="{tmp_path / "notes.md"}">\nnote body\n</file>' in sent
    assert sent.count("note body") == 1  # named twice (path and glob), sent once
    assert "print('a')" in sent and "print('b')" in sent
    assert "secret-ish" not in sent  # hidden entries of a directory are skipped
    assert '<file name="stdin">\nfrom stdin\n</file>' in sent
    assert "Summarise" in sent


@pytest.mark.parametrize("kind", ["binary", "latin1", "too-big", "missing"])
def test_f_refuses_naming_the_path_and_stores_nothing(tmp_path: Path, fake: FakeModel,
                                                      kind: str) -> None:
    bad = tmp_path / f"bad-{kind}.txt"
    if kind == "binary":
        bad.write_bytes(b"\x89PNG\0\0data")
    elif kind == "latin1":
        bad.write_bytes("café".encode("latin-1"))
    elif kind == "too-big":
        bad.write_text("word " * 220_000)
    store = f"json://{tmp_path}/s"
    result = invoke(["ask", "-f", str(bad), "hi"], store=store, env=env_for(tmp_path, fake))
    assert result.code == 2, result
    assert str(bad) in result.err
    assert {"binary": "binary file", "latin1": "not UTF-8 text", "too-big": "over the 1.0 MiB",
            "missing": "no such file"}[kind] in result.err
    assert "nothing was sent or stored" in result.err
    assert not chats(fake)
    assert not (tmp_path / "s").exists() or not list((tmp_path / "s").glob("*.json"))


# -- chatstate models -----------------------------------------------------------------------

def test_models_lists_the_endpoint_and_marks_the_default(tmp_path: Path) -> None:
    with FakeModel(model="local-7b") as fake:
        result = invoke(["models"], env=env_for(tmp_path, fake, CHATSTATE_MODEL="local-7b"))
        other = invoke(["models", "--json"], env=env_for(tmp_path, fake))
        gets = [e for e in fake.request_log if e["path"] == "/v1/models"]
    assert result.code == 0, result.err
    assert result.out == "* local-7b\n"
    assert "store " not in result.err  # it opens no store
    assert other.json() == {"models": ["local-7b"], "default": "gpt-4o-mini"}
    assert len(gets) == 2


# -- config.toml ---------------------------------------------------------------------------

def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_config_toml_sets_model_options_aliases_and_store_below_env(
        tmp_path: Path, fake: FakeModel) -> None:
    store = tmp_path / "from-config"
    write_config(tmp_path, f'model = "cfg-model"\nstore = "json://{store}"\n'
                           '[options]\ntemperature = 0.25\n[aliases]\nfast = "tiny-model"\n')
    env = env_for(tmp_path, fake)
    assert invoke(["ask", "--id", "c1", "one"], env=env).code == 0
    assert invoke(["ask", "--id", "c1", "-m", "fast", "two"], env=env).code == 0
    assert invoke(["ask", "--id", "c1", "--temperature", "0.9", "three"],
                  env=dict(env, CHATSTATE_MODEL="env-model")).code == 0
    first, second, third = chats(fake)
    assert (first["model"], first["body"]["temperature"]) == ("cfg-model", 0.25)
    assert second["model"] == "tiny-model"
    assert (third["model"], third["body"]["temperature"]) == ("env-model", 0.9)
    assert (store / "c1.json").exists()


def test_dotenv_in_the_config_dir_is_read_from_any_directory(tmp_path: Path,
                                                             fake: FakeModel) -> None:
    write_config(tmp_path, 'model = "cfg-model"\n')
    (tmp_path / "cfg" / ".env").write_text("CHATSTATE_MODEL=dotenv-model\n")
    result = invoke(["ask", "hi"], store=f"json://{tmp_path}/s", env=env_for(tmp_path, fake))
    assert result.code == 0, result.err
    assert chats(fake)[-1]["model"] == "dotenv-model"  # .env ranks above config.toml


def test_bad_toml_is_one_line_naming_the_file_and_the_line(tmp_path: Path,
                                                           fake: FakeModel) -> None:
    path = write_config(tmp_path, 'model = "ok"\ntemperature 0.2\n')
    result = invoke(["ask", "hi"], store=f"json://{tmp_path}/s", env=env_for(tmp_path, fake))
    assert result.code == 2
    (line,) = [x for x in result.err.splitlines() if x]
    assert f"{path} line 2 is not valid TOML" in line
    assert "fix that line" in line
    assert not chats(fake)


def test_config_path_and_show_never_print_the_key(tmp_path: Path, fake: FakeModel) -> None:
    path = write_config(tmp_path, 'model = "cfg-model"\n[aliases]\nfast = "x"\n')
    env = env_for(tmp_path, fake)
    assert invoke(["config", "path"], env=env).out == f"{path}\n"
    shown = invoke(["config", "show"], env=env)
    assert shown.code == 0, shown.err
    assert "sk-test-cli" not in shown.out + shown.err
    assert "api_key = (set)  [environment CHATSTATE_API_KEY]" in shown.out
    assert f"model = cfg-model  [{path}]" in shown.out
    doc = invoke(["config", "show", "--json"], env=env).json()
    assert doc["settings"]["aliases"]["value"] == {"fast": "x"}


# -- quiet where it is noise ------------------------------------------------------------------

def test_read_only_commands_drop_the_durable_line_writing_ones_keep_it(
        tmp_path: Path, fake: FakeModel) -> None:
    store = f"sqlite://{tmp_path}/q.db"
    env = env_for(tmp_path, fake)
    wrote = invoke(["ask", "--id", "q1", "hi"], store=store, env=env)
    assert wrote.first_err_line.startswith(f"store {store} on ")  # invariant 8: a write
    for args in (["list"], ["replay", "q1"], ["search", "hi"], ["usage"]):
        quiet = invoke(args, store=store, env=env)
        assert quiet.code == 0, quiet.err
        assert "store " not in quiet.err, (args, quiet.err)
        loud = invoke(["-v", *args], store=store, env=env)
        assert loud.first_err_line.startswith(f"store {store} on "), (args, loud.err)
    hushed = invoke(["-q", "ask", "--id", "q1", "again"], store=store, env=env)
    assert hushed.code == 0 and hushed.out.startswith("Echo: again")
    assert hushed.err == ""
    assert invoke(["ask", "-q", "--id", "q1", "more"], store=store, env=env).err == ""


# -- honest trimming -------------------------------------------------------------------------

def test_ask_says_when_it_sends_fewer_messages_than_stored(tmp_path: Path,
                                                           fake: FakeModel) -> None:
    store = f"json://{tmp_path}/s"
    env = env_for(tmp_path, fake)
    for i in range(4):
        assert invoke(["ask", "--id", "t", f"message {i} " + "word " * 40], store=store,
                      env=env).code == 0
    result = invoke(["ask", "--id", "t", "--context-window", "300", "last"], store=store,
                    env=env)
    assert result.code == 0, result.err
    sent = len(chats(fake)[-1]["messages"])
    assert sent < 9
    assert f"note: sending the last {sent} of 9 messages (context window 300); the older " \
           "ones stay stored" in result.err


def test_a_first_message_too_big_alone_gets_advice_that_can_work(tmp_path: Path) -> None:
    with FakeModel(context_window=50) as fake:
        result = invoke(["ask", "--new", "word " * 200], store=f"json://{tmp_path}/s",
                        env=env_for(tmp_path, fake))
    assert result.code == 1
    assert "Your message alone" in result.err
    assert "maximum context length is 50 tokens" in result.err  # the provider's words stay
    assert "--context-window N" in result.err and "split it" in result.err
    assert "start a new conversation" not in result.err  # that cannot help here


# -- --no-log ----------------------------------------------------------------------------------

def test_no_log_sends_with_the_history_and_stores_nothing(tmp_path: Path,
                                                          fake: FakeModel) -> None:
    store = f"json://{tmp_path}/s"
    env = env_for(tmp_path, fake)
    assert invoke(["ask", "--id", "n1", "remember me"], store=store, env=env).code == 0
    before = replay_json(store, "n1")
    result = invoke(["ask", "--id", "n1", "--no-log", "off the record"], store=store, env=env)
    assert result.code == 0, result.err
    assert result.out.startswith("Echo: off the record")
    assert "not stored (--no-log)" in result.err
    assert "store " not in result.err  # nothing is written: no durable line
    sent = chats(fake)[-1]["messages"]
    assert sent[0]["content"] == "remember me"  # the model saw the history
    assert replay_json(store, "n1") == before
    fresh = invoke(["ask", "--id", "n2", "--no-log", "never kept"], store=store, env=env)
    assert fresh.code == 0
    assert not (tmp_path / "s" / "n2.json").exists()
    assert invoke(["ask", "--id", "n1", "--retry", "--no-log"], store=store,
                  env=env).code == 2
    # --json names no seq for what was not stored (it gave the next stored turn's)
    told = invoke(["ask", "--id", "n1", "--no-log", "--json", "again"], store=store, env=env)
    assert told.code == 0, told.err
    assert (told.json()["user_seq"], told.json()["reply_seq"]) == (None, None)
    assert told.json()["reply"].startswith("Echo: again")


def test_chat_no_log_says_so_and_stores_nothing(tmp_path: Path, fake: FakeModel) -> None:
    store = f"json://{tmp_path}/s"
    result = invoke(["chat", "--id", "r1", "--no-log"], store=store, input="hello\n",
                    env=env_for(tmp_path, fake))
    assert result.code == 0, result.err
    assert "not stored (--no-log)" in result.err
    assert "Echo: hello" in result.out
    assert not (tmp_path / "s" / "r1.json").exists()


# -- /copy ------------------------------------------------------------------------------------

def test_copy_without_a_clipboard_says_so(tmp_path: Path, fake: FakeModel) -> None:
    env = env_for(tmp_path, fake, PATH="/nonexistent", DISPLAY="", WAYLAND_DISPLAY="")
    result = invoke(["chat", "--id", "k1"], store=f"json://{tmp_path}/s",
                    input="hi\n/copy\n/copy code\n", env=env)
    assert "no clipboard here" in result.err
    assert "the last reply has no code block" in result.err


def test_copy_uses_a_clipboard_program_it_finds(tmp_path: Path, fake: FakeModel) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sink = tmp_path / "clip.txt"
    tool = bin_dir / "xclip"
    tool.write_text(f"#!/bin/sh\ncat > {sink}\n")
    tool.chmod(0o755)
    env = env_for(tmp_path, fake, PATH=f"{bin_dir}:/usr/bin:/bin", DISPLAY=":0")
    fake.script.options.reply_words = 0
    store = f"json://{tmp_path}/s"
    assert invoke(["ask", "--id", "k2", "see\n```py\nx = 1\n```"], store=store,
                  env=env).code == 0
    result = invoke(["chat", "--id", "k2"], store=store, input="/copy code\n", env=env)
    assert "copied the last code block" in result.err and "with xclip" in result.err, \
        result.err
    assert json.dumps(sink.read_text()) == json.dumps("x = 1\n")


def test_config_toml_refuses_a_key_and_sets_the_context_window(tmp_path: Path,
                                                               fake: FakeModel) -> None:
    path = write_config(tmp_path, 'api_key = "sk-in-the-wrong-place-0123"\n')
    refused = invoke(["ask", "hi"], store=f"json://{tmp_path}/s", env=env_for(tmp_path, fake))
    assert refused.code in (1, 2)
    assert f"{path}: unknown setting 'api_key'" in refused.err
    assert ".env" in refused.err and "sk-in-the-wrong-place" not in refused.err
    write_config(tmp_path, "context_window = 300\n")
    store = f"json://{tmp_path}/s"
    env = env_for(tmp_path, fake)
    for i in range(4):
        assert invoke(["ask", "--id", "w", f"m{i} " + "word " * 40], store=store,
                      env=env).code == 0
    assert "(context window 300)" in invoke(["ask", "--id", "w", "x"], store=store,
                                            env=env).err


def test_chat_f_goes_with_the_first_message(tmp_path: Path, fake: FakeModel) -> None:
    (tmp_path / "todo.txt").write_text("buy milk\n")
    store = f"json://{tmp_path}/s"
    result = invoke(["chat", "--id", "f1", "-f", str(tmp_path / "todo.txt")], store=store,
                    input="what is on it?\nand then?\n", env=env_for(tmp_path, fake))
    assert result.code == 0, result.err
    first, second = (user_text(e) for e in chats(fake))
    assert "buy milk" in first and "what is on it?" in first
    assert "buy milk" not in second


def test_a_verdict_other_than_durable_is_printed_even_for_reading() -> None:
    """Invariant 8: the warning of an accepted ephemeral store is never hidden, not by a
    read-only command, not by -q."""
    for args in (["list"], ["-q", "list"]):
        result = invoke(["--allow-ephemeral", *args], store="memory://round3-ephemeral")
        assert result.code == 0, result.err
        assert result.first_err_line.startswith("store memory://round3-ephemeral "), result.err
        assert "ephemeral" in result.first_err_line
