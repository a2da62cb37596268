"""Long conversations keep working: each request is fitted to the context window.

The fake model enforces a 4,096-token window (one token per word, as its usage
reports) and answers 400 past it, as OpenAI does. The store keeps everything;
only the request is trimmed. Which messages were sent is read from the fake's
request log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.cli_helpers import API_KEY, invoke, replay_json

from chatstate.core.transcript import Conversation, Message, new_turn_id
from chatstate.errors import ModelError
from chatstate.session.chat import Chat
from chatstate.session.context import (
    MESSAGE_OVERHEAD,
    estimate_tokens,
    fit,
    message_tokens,
    turns,
    window_from_error,
)
from chatstate.stores import open_store
from chatstate.testing import FakeModel

WINDOW = 4096


def build(store_url: str, cid: str, pairs: int) -> list[Message]:
    """A stored conversation: one system message, then ``pairs`` user/assistant turns."""
    store = open_store(store_url)
    messages: list[Message] = []

    def add(role: str, content: str, turn: str, **extra: Any) -> None:
        messages.append(Message.seal(messages[-1] if messages else None, role=role,  # type: ignore[arg-type]
                                     content=content, turn_id=turn, **extra))

    add("system", "You are a patient tutor.", new_turn_id())
    for n in range(pairs):
        turn = new_turn_id()
        add("user", f"question {n}: how do tides work near estuary number {n}?", turn)
        answer = f"answer {n}: " + " ".join(["the moon pulls the water"] * 3)
        add("assistant", answer, turn, model="fake-model",
            usage={"prompt_tokens": 0, "completion_tokens": len(answer.split()),
                   "total_tokens": len(answer.split())})
    store.create(Conversation(id=cid, title="long"))
    store.append(cid, messages)
    store.close()
    return messages


def ask(store: str, fake: FakeModel, *args: str) -> Any:
    result = invoke(["ask", "--base-url", fake.base_url, "--model", "fake-model", "--json",
                     *args], store=store, env={"CHATSTATE_API_KEY": API_KEY,
                                               "CHATSTATE_MAX_RETRIES": "0"})
    assert result.code == 0, result.err
    return result.json()


def test_a_2000_message_conversation_keeps_working_after_learning_the_window(
        local_store_url: str) -> None:
    """No flag: the first request carries all 2,001 messages and gets the provider's 400;
    the window is learned and stored, and the same ask is retried once with the system
    message plus the newest whole turns. The next ask is fitted from the start. The store
    still holds every message."""
    s = local_store_url
    stored = build(s, "big", pairs=1000)
    with FakeModel(context_window=WINDOW) as fake:
        first = ask(s, fake, "--id", "big", "what about rivers?")
        log = fake.request_log
        assert [e["status"] for e in log] == [400, 200]
        assert len(log[0]["messages"]) == 2002  # everything, before the window was known
        sent = log[1]["messages"]
        assert first["sent_messages"] == len(sent) < 2002

        # the system message, then a contiguous tail of whole turns ending in the new one
        assert sent[0] == {"role": "system", "content": "You are a patient tutor."}
        tail = [m.to_openai() for m in stored][-(len(sent) - 2):]
        assert sent[1:-1] == tail
        assert sent[1]["role"] == "user"
        assert sent[-1] == {"role": "user", "content": "what about rivers?"}
        words = sum(len(m["content"].split()) for m in sent)
        assert words <= WINDOW  # the provider's own count
        # and it is the most that fits: one more (older) whole turn would not have
        kept = stored[-(len(sent) - 2):]
        older = stored[-(len(sent) - 2) - 2:-(len(sent) - 2)]
        new = estimate_tokens("what about rivers?") + MESSAGE_OVERHEAD
        cost = sum(message_tokens(m) for m in [stored[0], *kept]) + new
        budget = WINDOW - WINDOW // 8
        assert cost <= budget < cost + sum(message_tokens(m) for m in older)

        doc = replay_json(s, "big")
        assert doc["metadata"]["context_window"] == {"fake-model": WINDOW}
        assert len(doc["messages"]) == 2003  # nothing was dropped from the store

        fake.reset()
        second = ask(s, fake, "--id", "big", "and lakes?")
        log = fake.request_log
        assert [e["status"] for e in log] == [200]  # learned once: no second 400
        assert log[0]["messages"][0]["role"] == "system"
        assert log[0]["messages"][-3:-1] == [
            {"role": "user", "content": "what about rivers?"},
            {"role": "assistant", "content": first["reply"]}]
        assert second["sent_messages"] == len(log[0]["messages"])


def test_explicit_window_trims_without_a_400(local_store_url: str) -> None:
    """--context-window N fits the very first request; nothing is learned or stored."""
    s = local_store_url
    build(s, "w", pairs=50)
    with FakeModel(context_window=WINDOW) as fake:
        out = ask(s, fake, "--id", "w", "--context-window", "300", "short?")
        (entry,) = fake.request_log
        assert entry["status"] == 200
        assert out["sent_messages"] == len(entry["messages"]) < 102
        assert sum(len(m["content"].split()) for m in entry["messages"]) <= 300
    assert "context_window" not in replay_json(s, "w")["metadata"]


def test_a_400_that_names_no_window_is_not_retried(local_store_url: str) -> None:
    s = local_store_url
    with FakeModel() as fake:
        fake.fail_next(400, message="Invalid value for 'temperature'.")
        result = invoke(["ask", "--base-url", fake.base_url, "--model", "fake-model", "hi"],
                        store=s, env={"CHATSTATE_API_KEY": API_KEY})
        assert result.code == 1
        assert "temperature" in result.err
        assert len(fake.request_log) == 1


def seal_all(specs: list[tuple[str, str, str, dict[str, Any]]]) -> list[Message]:
    out: list[Message] = []
    for role, content, turn, extra in specs:
        out.append(Message.seal(out[-1] if out else None, role=role,  # type: ignore[arg-type]
                                content=content, turn_id=turn, **extra))
    return out


def test_turns_are_never_split_and_tool_results_stay_with_their_call() -> None:
    msgs = seal_all([("system", "s", "a", {}), ("user", "u1", "t1", {}),
                     ("assistant", "r1", "t1", {}), ("user", "u2", "t2", {}),
                     ("tool", "result", "x", {}), ("assistant", "r2", "t2", {})])
    groups = turns(msgs)
    assert [[m.seq for m in g] for g in groups] == [[0], [1, 2], [3, 4, 5]]


def test_a_summary_stands_in_for_the_turns_it_covers() -> None:
    msgs = seal_all([("system", "be brief", "a", {}), ("user", "u1", "t1", {}),
                     ("assistant", "r1", "t1", {}), ("user", "u2", "t2", {}),
                     ("assistant", "r2", "t2", {}),
                     ("system", "summary of u1", "s", {"params": {"summary": {
                         "covers_to_seq": 2}}}),
                     ("user", "u3", "t3", {})])
    conv = Conversation(id="x", messages=msgs)
    sent = fit(conv, None).messages
    assert [m.content for m in sent] == ["be brief", "summary of u1", "u2", "r2", "u3"]
    assert "u2" not in [m.content for m in fit(conv, None, exclude={3}).messages]
    # with a tiny window the newest turn still goes, whole
    tiny = fit(conv, 40).messages
    assert [m.content for m in tiny][-1] == "u3"
    assert "summary of u1" in [m.content for m in tiny]


def test_window_from_error_reads_provider_texts() -> None:
    err = ModelError("x", status=400, provider_message="This model's maximum context length "
                     "is 8192 tokens. However, your messages resulted in 9000 tokens.")
    assert window_from_error(err) == 8192
    assert window_from_error(ModelError("x", status=500, provider_message="maximum context "
                                        "length is 8192")) is None


def test_library_learns_the_window_too(tmp_path: Path) -> None:
    """Chat, not the CLI, does the learning: a script gets the same behaviour."""
    url = f"sqlite://{tmp_path}/l.db"
    build(url, "lib", pairs=200)
    with FakeModel(context_window=1000) as fake:
        chat = Chat(url, conversation_id="lib", model="fake-model", base_url=fake.base_url,
                    api_key=API_KEY)
        chat.send("one more")
        assert chat.conversation.metadata["context_window"] == {"fake-model": 1000}
        assert chat.last_fit is not None
        assert chat.last_fit.trimmed
        assert "sending the last" in chat.last_fit.describe()
        chat.store.close()


@pytest.mark.parametrize("raw", ["0", "x"])
def test_bad_context_window_env_is_a_clear_error(local_store_url: str, raw: str) -> None:
    result = invoke(["ask", "--model", "fake", "hi"], store=local_store_url,
                    env={"CHATSTATE_CONTEXT_WINDOW": raw})
    assert result.code == 1
    assert "CHATSTATE_CONTEXT_WINDOW" in result.err


def test_the_long_conversation_example_runs(local_store_url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    example = ROOT / "examples" / "long_conversation.py"
    result = subprocess.run([sys.executable, str(example), local_store_url], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "request: 2002 messages -> HTTP 400"
    assert lines[2].startswith("request: ")
    assert lines[2].endswith("-> HTTP 200")
    assert "learned: {'fake-model': 4096}" in lines
    assert lines[-1] == "stored: 2003 messages (nothing was dropped)"


def test_the_fake_enforces_its_window_as_openai_does() -> None:
    import json
    import urllib.error
    import urllib.request

    def post(fake: FakeModel, words: int) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"model": "m", "messages": [
            {"role": "user", "content": " ".join(["w"] * words)}]}).encode()
        request = urllib.request.Request(f"{fake.base_url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    with FakeModel(context_window=5) as fake:
        assert post(fake, 5)[0] == 200
        status, body = post(fake, 6)
        assert status == 400
        assert body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["message"].startswith(
            "This model's maximum context length is 5 tokens. However, your messages "
            "resulted in 6 tokens.")
        assert [e["behaviour"] for e in fake.request_log] == ["ok", "context"]
        fake.configure(context_window=None)
        assert post(fake, 6)[0] == 200


@pytest.mark.parametrize("style", ["openai", "llama"])
def test_a_provider_counting_more_than_the_estimate_is_calibrated_from_its_error(
        local_store_url: str, style: str) -> None:
    """The provider's tokenizer counts 2.5x chatstate's estimate. Its 400 names the real
    count; chatstate calibrates from it and fits again, so every ask of a long
    conversation works, with at most one failed request per correction."""
    store = open_store(local_store_url)
    with FakeModel(context_window=600, reply_words=20) as fake:
        fake.configure(token_scale=2.5, overflow_style=style)
        chat = Chat(store, conversation_id="long", base_url=fake.base_url, api_key=API_KEY,
                    model="m")
        corrections = 0
        for i in range(25):
            fake.reset()
            fake.configure(token_scale=2.5, overflow_style=style, context_window=600)
            reply = chat.send(f"question {i}: " + "tell me about rivers and lakes " * 4)
            statuses = [e["status"] for e in fake.request_log]
            assert statuses[-1] == 200 and reply.text.startswith("Echo:")
            failed = statuses.count(400)
            assert failed <= 1, statuses  # one failed request per correction at most
            corrections += failed
        assert corrections <= 3
        metadata = chat.conversation.metadata
        assert metadata["context_window"] == {"m": 600}
        assert metadata["token_scale"]["m"] > 1.2  # what the provider counts over the estimate
        assert len([m for m in chat.conversation.messages if m.role == "user"]) == 25
