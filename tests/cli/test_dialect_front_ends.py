"""Every front end on the Responses and Anthropic Messages APIs, against the fake model over
real HTTP (the fake runs in this process, so its request log says which API each request
spoke): the REPL on a pty (a turn, a tool round, Ctrl-C mid-reply keeps the partial,
/retry completes it), ``batch run`` killed with SIGKILL mid-run and resumed, ``ask`` with
a Python tool, export/import, search, fork, usage, compact and models, context fitting,
and one conversation continued from Chat Completions to Responses to Anthropic Messages,
replayed and verified as one transcript.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.batch_child import PROMPT, ledger_rows, run_args, spawn, write_jsonl
from support.cli_helpers import API_KEY, ReplSession, cli_env, invoke, replay_json, strip_ansi

from chatstate import Chat, open_store
from chatstate.batch import Batch
from chatstate.testing import FakeModel, reply_text

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")

APIS = ("responses", "anthropic")
PATH = {"responses": "/v1/responses", "anthropic": "/v1/messages",
        "chat_completions": "/v1/chat/completions"}
FUNCTIONS = '''
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"
'''
CALL = 'get_weather({"city": "Paris"})'
ENV = {"CHATSTATE_API_KEY": API_KEY, "CHATSTATE_BACKOFF_BASE": "0.01"}


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as server:
        yield server


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    path = tmp_path / "fns.py"
    path.write_text(FUNCTIONS)
    return path


def model_args(fake: FakeModel, api: str) -> list[str]:
    return ["--base-url", fake.base_url, "--model", "fake-model", "--api", api]


def ask(store: str, fake: FakeModel, api: str, *args: str) -> Any:
    result = invoke(["ask", *model_args(fake, api), *args], store=store, env=ENV)
    assert result.code == 0, result.err
    return result


def paths(fake: FakeModel) -> set[str]:
    return {e["path"].split("?")[0] for e in fake.request_log}


def user_texts(entry: dict[str, Any]) -> list[str]:
    return [m["content"] for m in entry["messages"] if m.get("role") == "user"]


# -- the REPL on a pseudo-terminal -----------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_the_repl_turn_tool_round_ctrl_c_and_retry(api: str, tmp_path: Path, fake: FakeModel,
                                                   functions: Path) -> None:
    store = f"sqlite://{tmp_path}/s.db"
    repl = ReplSession(store, cli_env(tmp_path, **ENV), "--id", "r", "--base-url",
                       fake.base_url, "--api", api, "--functions", str(functions),
                       model="fake-model", timeout=60)
    try:
        assert "conversation r · model fake-model" in repl.prompt()
        first = repl.command("hello there", r"assistant> Echo: hello there[^\r]*\r\n")
        assert "Echo: hello there" in first
        tools = repl.command(CALL, r"assistant> Tool results: [^\r]*\r\n")
        assert 'tool call> get_weather({"city": "Paris"})' in tools
        assert "tool result> sunny in Paris" in tools and "=sunny in Paris" in tools
        fake.configure(reply_words=200, chunk_delay=0.01)
        repl.child.sendline("tell me a long story")
        repl.child.expect(r"assistant> Echo: tell me a long story( \w+){3}")
        repl.child.sendintr()
        repl.child.expect(r"\[interrupted: the partial reply is kept; /retry completes the turn\]")
        shown = repl.raw.split("assistant> ")[-1].partition("\r\n[interrupted")[0]
        repl.prompt()
        partial = replay_json(store, "r")["messages"][-1]
        assert (partial["role"], partial["status"]) == ("assistant", "partial")
        assert partial["content"].startswith(shown) and len(shown) > len("Echo: ")
        retried = repl.command("/retry", r"assistant> Echo: tell me a long story[^\r]*\r\n")
        # the reply the fake gave to the history the retry sent (the partial left out)
        full = fake.reply_for(fake.request_log[-1]["messages"])
        assert full in " ".join(strip_ansi(retried).split())
        assert repl.eof() == 0
    finally:
        repl.close()
    assert paths(fake) == {PATH[api]}
    messages = replay_json(store, "r")["messages"]
    assert [(m["role"], m["status"]) for m in messages] == [
        ("user", "complete"), ("assistant", "complete"),
        ("user", "complete"), ("assistant", "complete"), ("tool", "complete"),
        ("assistant", "complete"),
        ("user", "complete"), ("assistant", "partial"), ("assistant", "complete")]
    assert messages[-1]["content"] == full
    assert messages[3]["tool_calls"][0]["function"]["name"] == "get_weather"
    verified = invoke(["replay", "r", "--verify"], store=store)
    assert verified.code == 0, verified.err


# -- batch: killed mid-run, resumed ----------------------------------------------------------


def wait_for_done(out: Path, at_least: int, proc: Any) -> int:
    """Poll the ledger until ``at_least`` records are done (or the runner ended)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        db = out / ".chatstate-batch.db"
        if db.exists():
            try:
                done = sum(r["status"] == "done" for r in ledger_rows(db).values())
            except Exception:  # the runner is still creating the ledger
                done = 0
            if done >= at_least:
                return done
        time.sleep(0.01)
    raise AssertionError(f"the runner did not finish {at_least} records: {proc.poll()}")


@pytest.mark.parametrize("api", APIS)
def test_batch_run_killed_mid_run_resumes_and_completes(api: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out"
    # 24 records of ~0.25 s each, one at a time: the kill lands after the 2nd is done
    # and seconds before the last could be (with 8, a loaded machine once saw all done)
    ids = write_jsonl(source, 24)
    with FakeModel(reply_words=6, chunk_delay=0.04) as fake:
        args = [*run_args(source, out, fake.base_url, "-j", "1"), "--api", api]
        proc = spawn(args, cli_env(tmp_path, **ENV))
        try:
            wait_for_done(out, 2, proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        before = {k for k, r in ledger_rows(out / ".chatstate-batch.db").items()
                  if r["status"] == "done"}
        assert 2 <= len(before) < len(ids), before
        fake.configure(chunk_delay=0.0)
        again = invoke(args, env=ENV)
        assert again.code == 0, again.err
        assert f"{len(ids)}/{len(ids)} done, 0 failed" in again.out, again.out
        log = fake.request_log
    assert {e["path"] for e in log} == {PATH[api]}
    calls: dict[str, int] = {}
    cut = [e for e in log if e["body"] is None]  # the SIGKILL landed mid-upload: the
    assert len(cut) <= 1, cut                    # fake got part of a body, answered 400
    for entry in log:
        if entry["body"] is None:
            continue
        texts = user_texts(entry)
        assert texts, entry
        rid = texts[-1].split("|", 1)[0]
        calls[rid] = calls.get(rid, 0) + 1
    assert all(calls[rid] == 1 for rid in before)  # never called again once done
    for n, rid in enumerate(ids):
        prompt = PROMPT.format(id=rid, text=f"text of record {n}")
        expected = reply_text([{"role": "user", "content": prompt}], 6)
        assert (out / f"{rid}.txt").read_text() == expected + "\n"
    verified = invoke(["batch", "verify", "--out", str(out)])
    assert verified.code == 0, verified.out
    assert verified.out.startswith(f"verify ok: {len(ids)} done"), verified.out


@pytest.mark.parametrize("api", APIS)
def test_the_library_batch_takes_the_api(api: str, tmp_path: Path, fake: FakeModel) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out"
    write_jsonl(source, 3)
    with Batch(out, prompt=PROMPT, base_url=fake.base_url, api=api, api_key=API_KEY,
               model="fake-model", echo=lambda _: None) as job:
        summary = job.run(source)
    assert summary.ok and summary.counts["done"] == 3
    assert paths(fake) == {PATH[api]}


# -- the tool loop, and the commands that read or copy a conversation ------------------------


@pytest.mark.parametrize("api", APIS)
def test_ask_runs_a_python_tool_through_the_api(api: str, tmp_path: Path, fake: FakeModel,
                                               functions: Path) -> None:
    store = f"sqlite://{tmp_path}/s.db"
    result = ask(store, fake, api, "--id", "t", "--functions", str(functions), CALL)
    conv = replay_json(store, "t")["messages"]
    assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"]
    call_id = conv[1]["tool_calls"][0]["id"]
    assert result.out == f"Tool results: {call_id}=sunny in Paris\n"
    assert conv[2] == {**conv[2], "tool_call_id": call_id, "content": "sunny in Paris"}
    assert paths(fake) == {PATH[api]}
    second = fake.request_log[-1]["body"]
    if api == "responses":
        assert {"type": "function_call_output", "call_id": call_id,
                "output": "sunny in Paris"} in second["input"]
    else:
        results = [b for m in second["messages"] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        assert results and results[0]["tool_use_id"] == call_id


@pytest.mark.parametrize("api", APIS)
def test_export_import_search_fork_usage_compact_and_models(api: str, tmp_path: Path,
                                                            fake: FakeModel) -> None:
    store, other = f"sqlite://{tmp_path}/s.db", f"json://{tmp_path}/other"
    ask(store, fake, api, "--id", "x", "the quick brown fox")
    ask(store, fake, api, "--id", "x", "a lazy dog sleeps")
    before = replay_json(store, "x")
    exported = invoke(["export", "x", "-o", str(tmp_path / "x.json")], store=store)
    assert exported.code == 0, exported.err
    imported = invoke(["import", str(tmp_path / "x.json")], store=other)
    assert imported.code == 0 and imported.out == "x\n", imported.err
    assert [m["hash"] for m in replay_json(other, "x")["messages"]] == \
        [m["hash"] for m in before["messages"]]

    hits = invoke(["search", "fox"], store=store)
    assert sorted(line.split(":")[0] for line in hits.out.splitlines()) == ["x#0", "x#1"]

    forked = invoke(["fork", "x", "--at", "1", "--new-id", "f"], store=store)
    assert forked.code == 0, forked.err
    ask(store, fake, api, "--id", "f", "in the fork")
    fork_doc = replay_json(store, "f")
    assert fork_doc["metadata"]["forked_from"]["id"] == "x"
    assert [m["hash"] for m in fork_doc["messages"][:2]] == \
        [m["hash"] for m in before["messages"][:2]]
    assert user_texts(fake.request_log[-1]) == ["the quick brown fox", "in the fork"]
    assert len(replay_json(store, "x")["messages"]) == 4  # the original is unchanged

    usage = invoke(["usage", "--by", "conversation", "--json"], store=store)
    assert usage.code == 0, usage.err
    rows = {r["key"]: r for r in usage.json()["rows"]}
    stored = {cid: [m for m in replay_json(store, cid)["messages"] if m["role"] == "assistant"]
              for cid in ("x", "f")}
    for cid, replies in stored.items():
        assert all(m["usage"]["completion_tokens"] > 0 for m in replies)
        assert rows[cid]["completion_tokens"] == sum(
            m["usage"]["completion_tokens"] for m in replies
            if m["seq"] >= (2 if cid == "f" else 0))  # a fork's copied reply counts once

    fake.reset()
    compacted = invoke(["compact", "x", "--keep", "1", *model_args(fake, api)], store=store,
                       env=ENV)
    assert compacted.code == 0, compacted.err
    assert "stored summary at seq 4" in compacted.err
    models = invoke(["models", "--base-url", fake.base_url, "--api", api, "--json"],
                    store=store, env=ENV)
    assert models.code == 0, models.err
    assert "fake-model" in models.json()["models"]
    assert [e["path"].split("?")[0] for e in fake.request_log] == [PATH[api], "/v1/models"]


# -- context fitting ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_a_long_history_is_fitted_to_the_window(api: str, tmp_path: Path,
                                                fake: FakeModel) -> None:
    """An explicit window trims the request; a provider's overflow error in the API's own
    shape teaches the window, and the same turn is refitted once. The store keeps all."""
    store = f"sqlite://{tmp_path}/s.db"
    chat = Chat(store, conversation_id="big", base_url=fake.base_url, api=api,
                api_key=API_KEY, model="fake-model", system="You are a patient tutor.")
    filler = " ".join(f"word{i}" for i in range(20))
    for n in range(30):
        chat.send(f"question {n} {filler}")
    chat.store.close()
    fake.reset()
    fitted = ask(store, fake, api, "--id", "big", "--context-window", "300", "--json",
                 "short?")
    (entry,) = fake.request_log
    assert entry["status"] == 200 and entry["path"].split("?")[0] == PATH[api]
    sent = entry["messages"]
    assert json.loads(fitted.out)["sent_messages"] == len(sent) < 62
    assert sent[0] == {"role": "system", "content": "You are a patient tutor."}
    assert sent[-1] == {"role": "user", "content": "short?"}
    assert sum(len(str(m["content"]).split()) for m in sent) <= 300

    fake.reset()
    fake.configure(context_window=400)
    learned = ask(store, fake, api, "--id", "big", "--json", "and lakes?")
    log = fake.request_log
    assert [e["status"] for e in log] == [400, 200]
    assert len(log[0]["messages"]) == 64 and len(log[1]["messages"]) < 64
    assert json.loads(learned.out)["sent_messages"] == len(log[1]["messages"])
    doc = replay_json(store, "big")
    assert doc["metadata"]["context_window"] == {"fake-model": 400}
    assert len(doc["messages"]) == 65  # the system message and every turn are kept


# -- one conversation through three APIs -------------------------------------------------------


def test_one_conversation_through_chat_completions_responses_then_anthropic(
        tmp_path: Path, fake: FakeModel) -> None:
    store = f"sqlite://{tmp_path}/s.db"
    apis = ("chat_completions", "responses", "anthropic")
    for n, api in enumerate(apis):
        result = ask(store, fake, api, "--id", "one", f"question {n}")
        assert result.out.startswith(f"Echo: question {n}")
    log = fake.request_log
    assert [e["path"].split("?")[0] for e in log] == [PATH[a] for a in apis]
    doc = replay_json(store, "one")
    messages = doc["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    # each request carried the whole history, in the stored form whichever API wrote it
    for n, entry in enumerate(log):
        assert [m["content"] for m in entry["messages"]] == \
            [m["content"] for m in messages[: 2 * n + 1]]
    assert (messages[3].get("extra") or {}).get("response_id")
    verified = invoke(["replay", "one", "--verify"], store=store)
    assert verified.code == 0, verified.err
    s = open_store(store)
    try:
        assert s.load("one").verify() is None
    finally:
        s.close()
