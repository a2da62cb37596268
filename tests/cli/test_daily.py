"""Templates, forks, compaction and usage: the library functions and their thin commands."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from support.cli_helpers import API_KEY, CHATSTATE, cli_env, invoke, replay_json

from chatstate.ops import templates
from chatstate.ops.usage import collect, parse_since
from chatstate.session.chat import Chat
from chatstate.session.compact import compact
from chatstate.stores import open_store
from chatstate.testing import FakeModel


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a user whose config directory is under tmp_path."""
    env = cli_env(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    monkeypatch.delenv(templates.ENV_DIR, raising=False)
    return env


# -- templates -----------------------------------------------------------------------------

def test_templates_save_list_show_rm(home: dict[str, str], tmp_path: Path) -> None:
    saved = invoke(["templates", "save", "review", "--system", 'Review {lang} code; say "ok".',
                    "--model", "gpt-4o-mini", "--param", "temperature=0.2",
                    "--param", "stop=[\"END\"]"], env=home)
    assert saved.code == 0, saved.err
    path = tmp_path / "home" / "config" / "chatstate" / "templates" / "review.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert invoke(["templates", "list"], env=home).out == "review\n"
    shown = invoke(["templates", "show", "review"], env=home).out
    assert 'system = "Review {lang} code; say \\"ok\\"."' in shown
    assert "temperature = 0.2" in shown
    tpl = templates.load("review")
    assert (tpl.model, tpl.params) == ("gpt-4o-mini", {"temperature": 0.2, "stop": ["END"]})
    assert tpl.render({"lang": "Rust"}) == 'Review Rust code; say "ok".'
    assert invoke(["templates", "rm", "review"], env=home).code == 0
    gone = invoke(["templates", "show", "review"], env=home)
    assert gone.code == 1
    assert "no template 'review'" in gone.err


def test_template_text_round_trips(home: dict[str, str]) -> None:
    text = 'quotes " back\\slash \ttab\nnewline \x7f del, unicode é 😀, {x} and {"json": 1}'
    templates.save(templates.Template("odd", text, None, {"n": 3, "flag": True}))
    tpl = templates.load("odd")
    assert tpl.system == text
    assert tpl.params == {"n": 3, "flag": True}
    assert tpl.placeholders() == ["x"]  # braces around anything else are left alone
    assert tpl.render({"x": "X"}).endswith('X and {"json": 1}')


def test_ask_with_a_template_fills_placeholders(home: dict[str, str],
                                                local_store_url: str) -> None:
    templates.save(templates.Template("t", "You speak {lang}.", "fake", {"temperature": 0.5}))
    missing = invoke(["ask", "-t", "t", "hi"], store=local_store_url, env=home)
    assert missing.code == 1
    assert "needs a value for lang: pass -p lang VALUE" in missing.err
    assert invoke(["list", "--json"], store=local_store_url).json() == []  # nothing stored
    ok = invoke(["ask", "-t", "t", "-p", "lang", "Welsh", "--id", "w", "hi"],
                store=local_store_url, env=home)
    assert ok.code == 0, ok.err
    system, user, reply = replay_json(local_store_url, "w")["messages"]
    assert system["content"] == "You speak Welsh."
    assert user["params"] == {"temperature": 0.5}
    assert reply["model"] == "fake"
    lone = invoke(["ask", "-p", "a", "b", "--model", "fake", "hi"], store=local_store_url)
    assert lone.code == 2
    assert "add -t NAME" in lone.err


def test_a_damaged_template_is_named(home: dict[str, str]) -> None:
    templates.save(templates.Template("bad", "x"))
    path = templates.templates_dir() / "bad.toml"
    path.write_text("system = [unclosed")
    result = invoke(["templates", "show", "bad"], env=home)
    assert result.code == 1
    assert str(path) in result.err
    assert "not valid TOML" in result.err
    path.write_text('system = "x"\ncolour = "red"\n')
    result = invoke(["templates", "show", "bad"], env=home)
    assert result.code == 1
    assert "unknown keys colour" in result.err
    assert invoke(["templates", "save", "../x", "--system", "y"], env=home).code == 1


@pytest.mark.parametrize("key", ["model", "messages", "stream"])
def test_a_template_cannot_hold_model_messages_or_stream_as_a_parameter(
        home: dict[str, str], local_store_url: str, key: str) -> None:
    # a saved model=... went upstream in place of --model and /model, unsaid, and the
    # reply was stored (and counted by usage) under it
    saved = invoke(["templates", "save", "t", "--param", f"{key}=gpt-x"], env=home)
    assert saved.code == 2
    assert f"{key} is not a model parameter" in saved.err
    assert templates.list_names() == []
    path = templates.templates_dir() / "old.toml"  # saved by an earlier version
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'model = "fake"\n[params]\n{key} = "gpt-x"\n')
    used = invoke(["ask", "-t", "old", "--model", "fake", "--id", "o", "hi"],
                  store=local_store_url, env=home)
    assert used.code == 1
    assert str(path) in used.err and f"holds {key}" in used.err
    assert invoke(["list", "--json"], store=local_store_url).json() == []  # nothing stored


def test_replay_requests_lists_every_turn_that_asked_and_no_summary(
        local_store_url: str) -> None:
    # plain turns were left out (no params on their user message), a compaction's
    # summary was listed as a request with "no reply", and the model was always "-"
    s = local_store_url
    for n, extra in enumerate(([], ["--temperature", "0.3"], [], [])):
        done = invoke(["ask", "--model", "fake", "--id", "r", *extra, f"question {n}"], store=s)
        assert done.code == 0, done.err
    assert invoke(["compact", "r", "--model", "fake", "--keep", "1"], store=s).code == 0
    after = invoke(["ask", "--model", "fake", "--id", "r", "after the summary"], store=s)
    assert after.code == 0, after.err
    assert "and a summary (the summary stands in for the rest)" in after.err
    assert "context window None" not in after.err  # no window is known: none to name
    rows = invoke(["replay", "r", "--requests", "--format", "json"], store=s).json()
    stored = replay_json(s, "r")["messages"]
    users = [m["seq"] for m in stored if m["role"] == "user"]
    assert [row["seq"] for row in rows] == users  # every turn, the summary not one
    assert all(row["model"] == "fake" and row["reply"]["status"] == "complete" for row in rows)
    assert [row["options"] for row in rows][:2] == [{}, {"temperature": 0.3}]
    text = invoke(["replay", "r", "--requests"], store=s).out
    assert "no reply" not in text and "model=fake" in text


# -- forks ---------------------------------------------------------------------------------

def test_fork_copies_a_prefix_and_never_touches_the_original(local_store_url: str) -> None:
    s = local_store_url
    for text in ("one", "two", "three"):
        assert invoke(["ask", "--model", "fake", "--id", "src", text], store=s).code == 0
    before = replay_json(s, "src")
    out = invoke(["fork", "src", "--at", "3", "--new-id", "f1"], store=s)
    assert out.code == 0, out.err
    assert out.out == "f1\n"
    assert "forked src at seq 3 into f1 (4 messages)" in out.err
    forked = replay_json(s, "f1")
    assert forked["metadata"]["forked_from"] == {"id": "src", "seq": 3,
                                                 "hash": before["messages"][3]["hash"]}
    assert forked["messages"] == before["messages"][:4]
    assert invoke(["replay", "f1", "--verify"], store=s).code == 0
    assert invoke(["ask", "--model", "fake", "--id", "f1", "four"], store=s).code == 0
    assert replay_json(s, "src") == before
    bad = invoke(["fork", "src", "--at", "99"], store=s)
    assert bad.code == 1
    assert "has seqs 0..5; cannot fork at 99" in bad.err
    taken = invoke(["fork", "src", "--new-id", "f1"], store=s)
    assert taken.code == 1
    assert replay_json(s, "f1")["messages"][4]["content"] == "four"


# -- compaction ----------------------------------------------------------------------------

def test_compact_sends_the_summary_instead_of_the_turns_it_covers(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/c.db"
    with FakeModel() as fake:
        chat = Chat(url, conversation_id="c", model="fake-model", base_url=fake.base_url,
                    api_key=API_KEY, system="be brief")
        for n in range(4):
            chat.send(f"q{n}")
        summary = compact(chat, keep_turns=1)
        assert summary is not None
        assert summary.params is not None
        assert summary.params["summary"]["covers_to_seq"] == 6
        ask = fake.request_log[-1]["messages"]
        assert ask[0]["content"] == "q0"  # the turns only: instructions are sent anyway
        assert ask[-1]["content"].startswith("Summarise the conversation so far")
        assert "q3" not in [m["content"] for m in ask]  # the kept turn is not summarised
        chat.send("q4")
        sent = fake.request_log[-1]["messages"]
        assert [m["content"] for m in sent][:2] == ["be brief", summary.content]
        assert [m["content"] for m in sent][2::2] == ["q3", "q4"]
        assert len(chat.store.load("c").messages) == 12  # every original stays in the chain
        usage = collect(chat.store, by="conversation").rows[0]
        assert usage.replies == 6  # five replies and the summary, whose call cost tokens too
        chat.store.close()


def test_compact_command(local_store_url: str) -> None:
    s = local_store_url
    empty = invoke(["compact", "nope", "--model", "fake"], store=s)
    assert empty.code == 1
    assert "no conversation 'nope'" in empty.err
    for text in ("a", "b"):
        invoke(["ask", "--model", "fake", "--id", "k", text], store=s)
    nothing = invoke(["compact", "k", "--model", "fake"], store=s)
    assert nothing.code == 0
    assert "nothing to compact" in nothing.err
    done = invoke(["compact", "k", "--model", "fake", "--keep", "1"], store=s)
    assert done.code == 0
    assert "stored summary at seq 4 (covers seqs up to 1)" in done.err
    assert done.out.startswith("Echo: Summarise")


# -- usage ---------------------------------------------------------------------------------

def test_usage_totals_by_model_conversation_and_day(local_store_url: str,
                                                    tmp_path: Path) -> None:
    s = local_store_url
    for cid, text in (("u1", "one two"), ("u1", "three"), ("u2", "four")):
        assert invoke(["ask", "--model", "fake", "--id", cid, text], store=s).code == 0
    assert invoke(["fork", "u1", "--new-id", "u1-fork"], store=s).code == 0  # counted once
    store = open_store(s)
    replies = [m for c in ("u1", "u2") for m in store.load(c).messages if m.role == "assistant"]
    report = collect(store, by="conversation")
    store.close()
    assert [(r.key, r.replies) for r in report.rows] == [("u1", 2), ("u2", 1)]
    assert sum(r.completion_tokens for r in report.rows) == sum(
        m.usage["completion_tokens"] for m in replies if m.usage)
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."fake"]\ninput = 1000.0\noutput = 2000.0\n')
    out = invoke(["usage", "--json", "--prices", str(prices)], store=s)
    assert out.code == 0, out.err
    (row,) = out.json()["rows"]
    expected = (row["prompt_tokens"] * 1000 + row["completion_tokens"] * 2000) / 1e6
    assert row["key"] == "fake"
    assert row["cost"] == pytest.approx(expected)
    table = invoke(["usage", "--by", "day", "--since", "1d"], store=s)
    assert table.code == 0
    assert table.out.splitlines()[0].split() == ["day", "replies", "prompt", "completion"]
    assert invoke(["usage", "--since", "2999-01-01", "--json"], store=s).json()["rows"] == []
    prices.write_text('[models."other"]\ninput = 1\noutput = 1\n')
    unpriced = invoke(["usage", "--prices", str(prices)], store=s)
    assert "no price for fake" in unpriced.err
    assert unpriced.out.split()[-1] == "?"
    assert invoke(["usage", "--since", "soon"], store=s).code == 2  # a usage error


def test_parse_since() -> None:
    from datetime import datetime, timezone

    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert parse_since("7d", now=now) == datetime(2026, 11, 24, tzinfo=timezone.utc)
    assert parse_since("2026-11-30", now=now) == datetime(2026, 11, 30, tzinfo=timezone.utc)


# -- output modes and import cost ----------------------------------------------------------

def test_ask_to_a_pipe_prints_plain_text_and_never_loads_rich(tmp_path: Path,
                                                              local_store_url: str) -> None:
    """No Markdown off a terminal: exactly the stored text; and rich is not even imported."""
    argv = ["chatstate", "--store", local_store_url, "ask", "--model", "fake", "**x**"]
    code = (f"import sys, runpy; sys.argv = {argv!r}\ntry:\n    runpy.run_module('chatstate', "
            "run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('RICH' if 'rich' in sys.modules else 'NO-RICH')")
    python = str(Path(CHATSTATE).with_name("python"))
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True,
                          env=cli_env(tmp_path), timeout=60, check=False)
    assert proc.stdout.startswith("Echo: **x**"), proc
    assert proc.stdout.endswith("NO-RICH\n"), proc
    assert "tokens/s" not in proc.stderr


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_color_and_dumb_terminals_get_plain_text(tmp_path: Path, local_store_url: str,
                                                    env: dict[str, str]) -> None:
    import pexpect

    child = pexpect.spawn(CHATSTATE, ["--store", local_store_url, "ask", "--model", "fake",
                                      "**x**"], env={**cli_env(tmp_path), **env},
                          encoding="utf-8", timeout=30)
    child.expect(pexpect.EOF)
    child.close()
    assert "Echo: **x**" in child.before
    assert "\x1b" not in child.before


def test_the_token_line_goes_to_stderr_only(tmp_path: Path, local_store_url: str) -> None:
    """On a terminal, stdout gets the rendered reply; the dim line is on stderr."""
    import pexpect

    env = cli_env(tmp_path)
    cmd = (f"exec {CHATSTATE} --store {local_store_url} ask --model fake hi "
           f"2>{tmp_path}/err")
    child = pexpect.spawn("/bin/sh", ["-c", cmd], env=env, encoding="utf-8", timeout=30)
    child.expect(pexpect.EOF)
    child.close()
    assert "Echo: hi" in child.before
    assert "tokens/s" not in child.before
    assert "tokens/s" in (tmp_path / "err").read_text()


def test_usage_json_shape(local_store_url: str) -> None:
    invoke(["ask", "--model", "fake", "x"], store=local_store_url)
    data = json.loads(invoke(["usage", "--json", "--by", "model"], store=local_store_url).out)
    assert set(data) == {"by", "since", "rows", "unpriced", "skipped"}
