"""The housekeeping commands through the real entry point, on the json and sqlite stores:
list, replay (four formats, partials, --verify), export/import, rm, prune, search.

`repair` is not tested here: no store implements ``quarantine`` yet, so the
command can only say so.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import invoke, replay_json

from chatstate.core.transcript import Conversation, Message, verify_chain
from chatstate.session.chat import Chat
from chatstate.stores import open_store
from chatstate.testing import FakeModel

MESSAGE_KEYS = {"seq", "role", "content", "status", "turn_id", "hash"}


def ask(store: str, cid: str, prompt: str) -> None:
    result = invoke(["ask", "--model", "fake", "--id", cid, "--no-stream", prompt], store=store)
    assert result.code == 0, result.err


def chain_ok(messages: list[dict[str, Any]]) -> bool:
    return verify_chain([Message.model_validate(m) for m in messages]) is None


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=30) as model:
        yield model


def leave_partial(store_url: str, cid: str, fake: FakeModel, prompt: str) -> str:
    """Start a streamed turn, stop after the first durable delta: a stored partial reply."""
    store = open_store(store_url)
    try:
        chat = Chat(store, conversation_id=cid, base_url=fake.base_url, model="fake-model",
                    api_key="sk-test-cli-0123456789abcdef")
        stream = chat.stream(prompt)
        first = next(stream)
        stream.close()
        return first
    finally:
        store.close()


def import_messages(store: str, tmp_path: Path, messages: list[dict[str, str]],
                    name: str = "msgs.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(messages))
    result = invoke(["import", str(path)], store=store)
    assert result.code == 0, result.err
    return result.out.strip()


# -- list ----------------------------------------------------------------------------------

def test_list_newest_first_json_and_limit(local_store_url: str) -> None:
    s = local_store_url
    empty = invoke(["list"], store=s)
    assert empty.code == 0
    assert empty.out == ""
    assert "(no conversations)" in empty.err
    for cid in ("first", "second", "third"):
        ask(s, cid, f"hello {cid}")
    text = invoke(["list"], store=s)
    assert [line.split()[0] for line in text.out.splitlines()] == ["third", "second", "first"]
    assert "2 msgs  hello third" in text.out.splitlines()[0]
    rows = invoke(["list", "--json"], store=s).json()
    assert [(r["id"], r["title"], r["message_count"]) for r in rows] == [
        ("third", "hello third", 2), ("second", "hello second", 2), ("first", "hello first", 2)]
    assert [r["id"] for r in invoke(["list", "--json", "--limit", "2"], store=s).json()] == [
        "third", "second"]



def test_ls_is_list(local_store_url: str) -> None:
    """``chatstate ls`` (what a shell's hands type) is ``list``, options and all; it said
    "No such command 'ls'"."""
    s = local_store_url
    for cid in ("first", "second"):
        ask(s, cid, f"hello {cid}")
    listed = invoke(["ls", "--json"], store=s)
    assert listed.code == 0, listed.err
    assert listed.json() == invoke(["list", "--json"], store=s).json()
    assert invoke(["ls"], store=s).out == invoke(["list"], store=s).out

# -- replay --------------------------------------------------------------------------------

def test_replay_formats(local_store_url: str) -> None:
    s = local_store_url
    ask(s, "r", "question one")
    ask(s, "r", "question two")
    doc = replay_json(s, "r")
    messages = doc["messages"]
    assert doc["id"] == "r"
    assert doc["title"] == "question one"
    assert doc["schema"] == 1
    assert [m["seq"] for m in messages] == [0, 1, 2, 3]
    assert all(set(m) >= MESSAGE_KEYS and m["status"] == "complete" for m in messages)
    assert messages[0]["turn_id"] == messages[1]["turn_id"] != messages[2]["turn_id"]
    assert chain_ok(messages)

    jsonl = invoke(["replay", "r", "--format", "jsonl"], store=s).out
    assert [json.loads(line) for line in jsonl.splitlines()] == messages
    text = invoke(["replay", "r"], store=s).out
    assert text.splitlines()[0] == "[0] user: question one"
    assert text.splitlines()[1] == f"[1] assistant: {messages[1]['content']}"
    markdown = invoke(["replay", "r", "--format", "markdown"], store=s).out
    assert markdown.startswith("# question one\n")
    assert "**user** · seq 2\n\nquestion two\n" in markdown
    assert invoke(["replay", "r", "--format", "yaml"], store=s).code == 2
    missing = invoke(["replay", "nope"], store=s)
    assert missing.code == 1
    assert "no conversation 'nope'" in missing.err


@pytest.mark.invariant(7)
def test_replay_shows_a_stored_partial_and_an_interrupted_turn(
        local_store_url: str, tmp_path: Path, fake: FakeModel) -> None:
    """A partial reply is a trailing message with status partial; a turn with no reply is a
    trailing user message; both come with a note saying how to complete them."""
    s = local_store_url
    ask(s, "p", "complete turn")
    first = leave_partial(s, "p", fake, "cut me off")
    result = invoke(["replay", "p", "--format", "json"], store=s)
    messages = result.json()["messages"]
    assert [(m["seq"], m["role"], m["status"]) for m in messages] == [
        (0, "user", "complete"), (1, "assistant", "complete"), (2, "user", "complete"),
        (3, "assistant", "partial")]
    assert messages[3]["content"].startswith(first)
    assert messages[3]["turn_id"] == messages[2]["turn_id"]
    assert "the last turn was interrupted; `chatstate ask --id p --retry`" in result.err
    assert "[3] assistant (partial: cut off): " in invoke(["replay", "p"], store=s).out

    cid = import_messages(s, tmp_path, [{"role": "user", "content": "hello"},
                                        {"role": "assistant", "content": "hi"},
                                        {"role": "user", "content": "unanswered"}])
    result = invoke(["replay", cid, "--format", "json"], store=s)
    last = result.json()["messages"][-1]
    assert (last["seq"], last["role"], last["content"]) == (2, "user", "unanswered")
    assert "the last turn was interrupted" in result.err


def tamper(store_url: str, cid: str, seq: int) -> None:
    """Edit one stored message's content behind the store's back (its hash stays)."""
    path = store_url.split("://", 1)[1]
    if store_url.startswith("json://"):
        file = Path(path) / f"{cid}.json"
        lines = file.read_text().splitlines(keepends=True)
        row = json.loads(lines[1 + seq].rstrip().rstrip(","))
        assert row["seq"] == seq
        lines[1 + seq] = lines[1 + seq].replace(json.dumps(row["content"]),
                                                json.dumps(row["content"] + "!"), 1)
        file.write_text("".join(lines))
        return
    with sqlite3.connect(path) as db:
        (body,) = db.execute("SELECT body FROM messages WHERE conversation_id=? AND seq=?",
                             (cid, seq)).fetchone()
        doc = json.loads(body)
        doc["content"] += "!"
        db.execute("UPDATE messages SET body=? WHERE conversation_id=? AND seq=?",
                   (json.dumps(doc), cid, seq))
    db.close()


@pytest.mark.invariant(6)
def test_replay_verify_names_the_first_bad_seq(local_store_url: str) -> None:
    s = local_store_url
    ask(s, "v", "one")
    ask(s, "v", "two")
    good = invoke(["replay", "v", "--verify"], store=s)
    assert good.code == 0
    assert "verified: 4 messages, chain intact" in good.err
    tamper(s, "v", 2)
    bad = invoke(["replay", "v", "--verify"], store=s)
    assert bad.code == 1
    assert bad.out == ""
    assert "verification failed at seq 2" in bad.err
    assert "Traceback" not in bad.err
    if s.startswith("json://"):
        assert "v.json" in bad.err  # names the file
    assert invoke(["replay", "v"], store=s).code == 1  # nor shown unverified


# -- export / import ---------------------------------------------------------------------------

def test_export_to_a_missing_directory_names_it_not_the_disk(local_store_url: str,
                                                              tmp_path: Path) -> None:
    # it said "could not create a temp file ...; check the disk and retry. Previously
    # stored data is unchanged": the store's words, for the user's own path
    ask(local_store_url, "e1", "hi")
    target = tmp_path / "missing" / "x.json"
    result = invoke(["export", "e1", "-o", str(target)], store=local_store_url)
    assert result.code == 1
    assert f"the directory {target.parent} does not exist; create it" in result.err
    assert "check the disk" not in result.err
    assert not target.parent.exists()


@pytest.mark.parametrize("target", ["json", "sqlite"])
def test_export_import_round_trip_keeps_hashes_and_the_partial(
        local_store_url: str, target: str, tmp_path: Path, fake: FakeModel) -> None:
    s = local_store_url
    ask(s, "x", "keep me")
    leave_partial(s, "x", fake, "and my partial")
    before = replay_json(s, "x")
    out = tmp_path / "x.export.json"
    exported = invoke(["export", "x", "-o", str(out)], store=s)
    assert exported.code == 0
    assert "exported x (3 messages)" in exported.err
    assert json.loads(out.read_text())["partial"]["status"] == "partial"

    other = f"json://{tmp_path}/other" if target == "json" else f"sqlite://{tmp_path}/o.db"
    imported = invoke(["import", str(out)], store=other)
    assert imported.code == 0, imported.err
    assert imported.out == "x\n", imported.err
    after = replay_json(other, "x")
    # the same messages (contents, timestamps, turn ids, hashes), the partial too; only
    # updated_at is the import's own
    assert {**after, "updated_at": None} == {**before, "updated_at": None}
    assert chain_ok(after["messages"][:-1])

    again = invoke(["import", str(out)], store=other)
    assert again.code == 1
    assert "already exists" in again.err
    assert "--id" in again.err
    renamed = invoke(["import", str(out), "--id", "x2"], store=other)
    assert renamed.code == 0
    assert renamed.out == "x2\n"
    assert [m["hash"] for m in replay_json(other, "x2")["messages"]] == [
        m["hash"] for m in before["messages"]]
    to_stdout = invoke(["export", "x", "-o", "-"], store=s)
    assert json.loads(to_stdout.out)["messages"] == before["messages"][:-1]


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare-list", "messages-key"])
def test_import_plain_openai_messages(local_store_url: str, tmp_path: Path,
                                      wrapped: bool) -> None:
    s = local_store_url
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
             {"role": "assistant", "content": "6"}]
    path = tmp_path / "openai.json"
    path.write_text(json.dumps({"title": "sums", "messages": plain} if wrapped else plain))
    result = invoke(["import", str(path)], store=s)
    assert result.code == 0, result.err
    cid = result.out.strip()
    assert cid.startswith("import-")
    assert "imported 5 messages" in result.err
    doc = replay_json(s, cid)
    messages = doc["messages"]
    assert [{"role": m["role"], "content": m["content"]} for m in messages] == plain
    assert chain_ok(messages)
    assert all(m["status"] == "complete" for m in messages)
    assert messages[1]["turn_id"] == messages[2]["turn_id"] != messages[3]["turn_id"]
    assert doc["title"] == ("sums" if wrapped else "")


@pytest.mark.parametrize("content", [
    '{"foo": 1}', "[]", "just some text", '[{"role": "wizard", "content": "x"}]',
    '{"schema": 1, "id": "x"}',
], ids=["object", "empty-list", "not-json", "bad-role", "broken-export"])
def test_import_refuses_what_is_not_a_transcript(tmp_path: Path, content: str) -> None:
    store = f"json://{tmp_path}/s"
    path = tmp_path / "in.json"
    path.write_text(content)
    result = invoke(["import", str(path)], store=store)
    assert result.code == 1
    assert result.out == ""
    errors = result.err.strip().splitlines()
    assert errors[-1].startswith("error: ")
    assert str(path) in errors[-1]
    assert "Traceback" not in result.err
    assert "unexpected" not in result.err
    assert invoke(["list", "--json"], store=store).json() == []


def test_import_refuses_a_tampered_export(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path}/s.db"
    ask(store, "t", "original")
    out = tmp_path / "t.json"
    assert invoke(["export", "t", "-o", str(out)], store=store).code == 0
    doc = json.loads(out.read_text())
    doc["messages"][1]["content"] = "forged"
    out.write_text(json.dumps(doc))
    result = invoke(["import", str(out), "--id", "t2"], store=store)
    assert result.code == 1
    assert "hash chain broken at seq 1" in result.err
    assert [r["id"] for r in invoke(["list", "--json"], store=store).json()] == ["t"]


# -- rm, prune, search ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["list", "--limit", "0"], ["list", "--limit", "-2"],
                                  ["search", "--limit", "0", "hi"],
                                  ["search", "--limit", "-1", "hi"]])
def test_a_limit_below_one_is_a_usage_error(local_store_url: str, args: list[str]) -> None:
    # it printed "(no conversations)" or "no matches" with conversations stored, or
    # dropped rows by Python's negative slicing
    ask(local_store_url, "c1", "hi")
    result = invoke(args, store=local_store_url)
    assert result.code == 2
    assert "--limit" in result.err


def test_rm(local_store_url: str) -> None:
    s = local_store_url
    ask(s, "keep", "a")
    ask(s, "drop", "b")
    # stdin is not a terminal: rm cannot ask, so it deletes nothing without --yes
    refused = invoke(["rm", "drop"], store=s)
    assert refused.code == 2
    assert "nothing was deleted. Add --yes" in refused.err
    assert sorted(r["id"] for r in invoke(["list", "--json"], store=s).json()) == ["drop", "keep"]
    result = invoke(["rm", "drop", "--yes"], store=s)
    assert result.code == 0
    assert "deleted drop" in result.err
    assert [r["id"] for r in invoke(["list", "--json"], store=s).json()] == ["keep"]
    assert invoke(["replay", "drop"], store=s).code == 1
    gone = invoke(["rm", "drop", "--yes"], store=s)
    assert gone.code == 1
    assert "no conversation 'drop'" in gone.err


def test_prune_is_a_dry_run_unless_yes(local_store_url: str) -> None:
    """Ages on either side of the cutoff by days, not by a sleep: a loaded machine can
    spend seconds between two commands, never days."""
    s = local_store_url
    store = open_store(s)
    long_ago = "2020-01-01T00:00:00.000000Z"
    store.create(Conversation(id="old", title="", created_at=long_ago, updated_at=long_ago))
    store.close()
    ask(s, "new", "b")
    dry = invoke(["prune", "--older-than", "1d"], store=s)
    assert dry.code == 0, dry.out
    assert dry.out == f"would delete old (updated {long_ago})\n", dry.out
    assert "dry run: 1 conversation(s)" in dry.err
    assert len(invoke(["list", "--json"], store=s).json()) == 2
    real = invoke(["prune", "--older-than", "1d", "--yes"], store=s)
    assert real.code == 0
    assert real.out.startswith("deleted old ")
    assert [r["id"] for r in invoke(["list", "--json"], store=s).json()] == ["new"]
    assert invoke(["prune", "--older-than", "30 days"], store=s).code == 2


def test_prune_counts_seconds(local_store_url: str) -> None:
    """Only a lower bound on time: after 1.2 s the conversation is older than 1 s however
    slow the machine is."""
    s = local_store_url
    ask(s, "recent", "a")
    time.sleep(1.2)
    dry = invoke(["prune", "--older-than", "1s"], store=s)
    assert dry.code == 0, dry.out
    assert dry.out.startswith("would delete recent (updated "), dry.out
    assert invoke(["prune", "--older-than", "1h"], store=s).out == ""


def test_search(local_store_url: str) -> None:
    s = local_store_url
    ask(s, "s1", "the quick brown fox")
    ask(s, "s2", "a lazy dog sleeps")
    hits = invoke(["search", "fox"], store=s)
    assert hits.code == 0
    assert sorted(line.split(":")[0] for line in hits.out.splitlines()) == ["s1#0", "s1#1"]
    assert "s1#0: the quick brown fox" in hits.out.splitlines()
    assert invoke(["search", "Brown FOX"], store=s).out == hits.out  # case is ignored
    limited = invoke(["search", "dog", "--limit", "1"], store=s)
    assert len(limited.out.splitlines()) == 1
    assert limited.out.startswith("s2#")
    none = invoke(["search", "zebra"], store=s)
    assert none.code == 0
    assert none.out == ""
    assert "no matches" in none.err


def test_search_scan_finds_the_text_of_a_message_with_parts(tmp_path: Path) -> None:
    """A store that is not Searchable is scanned: a message of text and image parts is
    matched by its text (it used to fail on the list)."""
    from chatstate.core.content import image, text

    url = f"json://{tmp_path}/store"
    store = open_store(url)
    try:
        store.create(Conversation(id="p1"))
        store.append("p1", [Message.seal(None, role="user", turn_id="t-1", content=[
            text("a photo of a red fox"), image(b"GIF89a tiny", media_type="image/gif")])])
    finally:
        store.close()
    hits = invoke(["search", "red fox"], store=url)
    assert hits.code == 0, hits.err
    assert hits.out.splitlines() == ["p1#0: a photo of a red fox"]
