"""The tool loop's contract, on every store, against the fake model over real HTTP.

Order (calls stored, tool run, result stored, model called again), errors the
model gets to see, the round limit, recovery of an interrupted turn (a
non-idempotent tool never runs twice), the request guard (a call without its
result and a result without its call never reach the model, checked on chains
built directly in the store), and compare-and-append for two writers.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.cli_helpers import invoke

from chatstate import (
    AsyncChat,
    Chat,
    ChatstateError,
    ConflictError,
    Conversation,
    Message,
    ToolLoopError,
    make_adapter,
    open_store,
    tool,
)
from chatstate.core.tools import current_call_id
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")

CALLS = [{"name": "get_weather", "arguments": {"city": "Paris"}},
         {"name": "send_email", "arguments": {"to": "ann@example.com", "body": "hi"}}]


class Tools:
    """Two tools that record every run, in order, with the store state at that moment."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str | None]] = []
        self.seen_lengths: list[int] = []
        self.url = ""
        self.cid = ""

        @tool
        def get_weather(city: str) -> str:
            """The weather in a city."""
            self._ran("get_weather")
            return f"sunny in {city}"

        @tool(idempotent=False)
        def send_email(to: str, body: str) -> str:
            """Send an email."""
            self._ran("send_email")
            return f"sent to {to}"

        self.get_weather, self.send_email = get_weather, send_email
        self.all = [get_weather, send_email]

    def _ran(self, name: str) -> None:
        self.runs.append((name, current_call_id()))
        if self.url:  # what a fresh process would see while the tool runs
            self.seen_lengths.append(len(fresh(self.url, self.cid).messages))


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=4) as model:
        model.configure(arg_chunk=1)
        yield model


def chat_for(url: str, fake: FakeModel, **kwargs: Any) -> Chat:
    adapter = make_adapter(base_url=fake.base_url, api_key="k", model="fake-model",
                           max_retries=2, backoff_base=0.001)
    return Chat(url, adapter=adapter, **kwargs)


def fresh(url: str, cid: str) -> Conversation:
    s = open_store(url)
    try:
        conv: Conversation = s.load(cid)
    finally:
        s.close()
    assert conv.verify() is None
    return conv


def requests(fake: FakeModel) -> list[list[dict[str, Any]]]:
    return [e["messages"] for e in fake.request_log if e["path"] == "/v1/chat/completions"]


def shape(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.status) for m in conv.messages]


@pytest.mark.parametrize("how", ["send", "stream", "async"])
def test_calls_stored_then_run_then_result_stored_then_model_again(
        store_url: str, fake: FakeModel, how: str) -> None:
    fake.add_tool_rule(contains="weather", calls=CALLS, text="Checking. ")
    tools = Tools()
    chat = chat_for(store_url, fake)
    tools.url, tools.cid = store_url, chat.id
    if how == "send":
        reply = chat.send("weather and mail", tools=tools.all)
    elif how == "stream":
        shown = "".join(chat.stream("weather and mail", tools=tools.all))
        reply = chat.messages[-1]
        assert shown == "Checking. " + reply.content
    else:
        async def run() -> Message:
            achat = AsyncChat(chat)
            return await achat.send("weather and mail", tools=tools.all)
        reply = asyncio.run(run())
    conv = fresh(store_url, chat.id)
    assert shape(conv) == [("user", "complete"), ("assistant", "complete"),
                           ("tool", "complete"), ("tool", "partial"), ("tool", "complete"),
                           ("assistant", "complete")]
    asking = conv.messages[1]
    assert asking.content == "Checking. "
    assert asking.tool_calls is not None
    assert [c["function"]["name"] for c in asking.tool_calls] == ["get_weather", "send_email"]
    assert json.loads(asking.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    ids = [c["id"] for c in asking.tool_calls]
    assert [m.tool_call_id for m in conv.messages[2:5]] == [ids[0], ids[1], ids[1]]
    assert [m.content for m in conv.messages[2:5]] == ["sunny in Paris", "started",
                                                       "sent to ann@example.com"]
    # each tool ran once, in order, with its call id, after the calls were durable; the
    # non-idempotent one only after its "started" marker was durable too
    assert tools.runs == [("get_weather", ids[0]), ("send_email", ids[1])]
    assert tools.seen_lengths == [2, 4]
    assert reply.content == (f"Tool results: {ids[0]}=sunny in Paris; "
                             f"{ids[1]}=sent to ann@example.com")
    first, second = requests(fake)
    assert [t["function"]["name"] for t in fake.request_log[-1]["body"]["tools"]] == \
        ["get_weather", "send_email"]
    assert first == [{"role": "user", "content": "weather and mail"}]
    assert second == [m.to_openai() for m in conv.messages[:5] if m.status != "partial"]
    assert chat.interrupted is None
    if how == "send":  # replay says what the marker is, not "partial: cut off: started"
        replayed = invoke(["replay", chat.id], store=store_url).out
        assert f"[3] tool send_email [{ids[1]}] (started: it may have run; its result is " \
            "the next message for this call, if any)\n" in replayed
        assert f"[4] tool send_email [{ids[1]}]: sent to ann@example.com" in replayed


def test_errors_reach_the_model_as_error_results(store_url: str, fake: FakeModel) -> None:
    @tool
    def boom(x: int) -> str:
        raise RuntimeError(f"exploded on {x}")

    fake.add_tool_rule(contains="go", calls=[
        {"name": "boom", "arguments": {"x": 3}},
        {"name": "no_such_tool", "arguments": {}},
        {"name": "boom", "arguments": '{"x": 3'},
        {"name": "boom", "arguments": "[1, 2]"},
        {"name": "boom", "arguments": {"y": 1}}])
    chat = chat_for(store_url, fake)
    reply = chat.send("go", tools=[boom])
    results = [m for m in fresh(store_url, chat.id).messages if m.role == "tool"]
    assert [m.status for m in results] == ["error"] * 5
    texts = [m.content for m in results]
    assert texts[0] == "error: RuntimeError: exploded on 3"
    assert "no tool named 'no_such_tool'" in texts[1]
    assert "boom" in texts[1]
    assert "not valid JSON" in texts[2]
    assert "must be a JSON object" in texts[3]
    assert texts[4].startswith("error: the arguments do not fit boom's parameters: ")
    # the model received every error result
    assert [m["content"] for m in requests(fake)[-1] if m["role"] == "tool"] == texts
    assert all(str(t) in str(reply.content) for t in texts)


@pytest.mark.parametrize("given", ["call_1", ""])
def test_repeated_or_empty_call_ids_each_get_their_own_result(
        store_url: str, fake: FakeModel, given: str) -> None:
    # one id for two calls: both ran, but the model was sent the first one's result for
    # both (and after a crash the second was never answered)
    sent: list[str] = []

    @tool(idempotent=False)
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    fake.add_tool_rule(contains="two", calls=[
        {"id": given, "name": "send_email", "arguments": {"to": "ann", "body": "hi"}},
        {"id": given, "name": "send_email", "arguments": {"to": "bob", "body": "hi"}}])
    chat = chat_for(store_url, fake)
    chat.send("two emails", tools=[send_email])
    assert sent == ["ann", "bob"]
    conv = fresh(store_url, chat.id)
    asking = next(m for m in conv.messages if m.tool_calls)
    ids = [c["id"] for c in asking.tool_calls or []]
    assert len(set(ids)) == 2 and all(ids)
    results = {m.tool_call_id: m.content for m in conv.messages if m.role == "tool"}
    assert [results[i] for i in ids] == ["sent to ann", "sent to bob"]
    told = {m["tool_call_id"]: m["content"] for m in requests(fake)[-1] if m["role"] == "tool"}
    assert told == results


def test_a_result_json_cannot_encode_still_reaches_the_model(store_url: str,
                                                           fake: FakeModel) -> None:
    # a dict with date keys (or a NaN) raised TypeError after the tool had run: the
    # turn could never be finished, and a side effect's result was lost
    import datetime

    ran: list[int] = []

    @tool(idempotent=False)
    def counts() -> Any:
        """Counts by day."""
        ran.append(1)
        return {datetime.date(2024, 1, 1): 3, "ratio": float("nan")}

    fake.add_tool_rule(contains="count", calls=[{"name": "counts", "arguments": {}}])
    chat = chat_for(store_url, fake)
    chat.send("count them", tools=[counts])
    assert ran == [1]
    [result] = [m for m in fresh(store_url, chat.id).messages
                if m.role == "tool" and m.status != "partial"]
    assert result.status == "complete"
    assert json.loads(str(result.content)) == {"2024-01-01": 3, "ratio": "nan"}


def test_two_tools_of_one_name_are_refused_before_anything_is_stored(
        store_url: str, fake: FakeModel) -> None:
    # the clash was found in the loop, after the user message was stored, so every
    # --retry the error suggested failed the same way
    @tool(name="lookup")
    def first(q: str) -> str:
        return q

    @tool(name="lookup")
    def second(q: str) -> str:
        return q

    chat = chat_for(store_url, fake)
    with pytest.raises(ChatstateError, match="two tools are named 'lookup'"):
        chat.send("look it up", tools=[first, second])
    assert fake.request_log == []
    assert [c.id for c in open_store(store_url).list_conversations()] == []


def test_an_async_tool_is_refused_where_it_is_made() -> None:
    # it was accepted, never awaited, and "<coroutine object ...>" stored as a success
    with pytest.raises(ChatstateError, match="async function"):
        @tool(idempotent=False)
        async def send_sms(to: str) -> str:
            return to


def test_max_tool_rounds_stops_with_a_clear_error(store_url: str, fake: FakeModel) -> None:
    fake.add_tool_rule(contains="loop", calls=[CALLS[0]], rounds=100)
    tools = Tools()
    chat = chat_for(store_url, fake, max_tool_rounds=3)
    with pytest.raises(ToolLoopError, match="more than 3 rounds") as info:
        chat.send("loop forever", tools=tools.all)
    assert info.value.rounds == 3
    assert len(tools.runs) == 3
    conv = fresh(store_url, chat.id)
    results = [m for m in conv.messages if m.role == "tool"]
    assert [m.status for m in results] == ["complete"] * 3 + ["error"]
    assert "max_tool_rounds=3" in results[-1].content
    assert len(requests(fake)) == 4
    turn = chat_for(store_url, fake, conversation_id=chat.id).interrupted
    assert turn is not None
    assert turn.pending_calls == ()  # answered, awaiting a reply


def seed(url: str, cid: str, specs: list[dict[str, Any]]) -> Conversation:
    """Write a chain directly to the store: each spec is Message.seal's fields."""
    s = open_store(url)
    try:
        s.create(Conversation(id=cid))
        last: Message | None = None
        for spec in specs:
            msg = Message.seal(last, **{"turn_id": "t-1", **spec})
            s.append(cid, [msg])
            last = msg
        conv: Conversation = s.load(cid)
        return conv
    finally:
        s.close()


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def interrupted_turn(url: str, cid: str, more: list[dict[str, Any]] | None = None
                     ) -> list[dict[str, Any]]:
    calls = [call("c1", "get_weather", {"city": "Rome"}),
             call("c2", "send_email", {"to": "bo@example.com", "body": "x"}),
             call("c3", "get_weather", {"city": "Oslo"})]
    seed(url, cid, [{"role": "user", "content": "weather and mail"},
                    {"role": "assistant", "content": "", "tool_calls": calls},
                    {"role": "tool", "content": "sunny in Rome", "tool_call_id": "c1"},
                    *(more or [])])
    return calls


@pytest.mark.invariant(7)
def test_recovery_reruns_idempotent_and_never_reruns_a_started_side_effect(
        store_url: str, fake: FakeModel) -> None:
    # the killed writer had stored its "started" marker for c2
    interrupted_turn(store_url, "conv-r", [{"role": "tool", "content": "started",
                                            "status": "partial", "tool_call_id": "c2"}])
    chat = chat_for(store_url, fake, conversation_id="conv-r")
    turn = chat.interrupted
    assert turn is not None
    assert turn.turn_id == "t-1"
    assert [(c.id, c.name, c.started) for c in turn.pending_calls] == [
        ("c2", "send_email", True), ("c3", "get_weather", False)]
    assert "send_email (c2, started)" in turn.describe()
    tools = Tools()
    reply = chat.retry(tools=tools.all)
    assert tools.runs == [("get_weather", "c3")]  # send_email was not run again
    conv = fresh(store_url, "conv-r")
    assert shape(conv)[3:] == [("tool", "partial"), ("tool", "unknown"), ("tool", "complete"),
                               ("assistant", "complete")]
    assert conv.messages[4].content.startswith("interrupted: the tool may or may not have run")
    assert conv.partial is None
    assert "c2=interrupted: the tool may or may not have run" in reply.content  # model told
    sent = [m.to_openai() for m in conv.messages[2:6] if m.status != "partial"]
    assert requests(fake)[-1][2:] == sent  # the marker is never sent


@pytest.mark.invariant(7)
def test_recovery_runs_a_side_effect_that_never_started(store_url: str,
                                                        fake: FakeModel) -> None:
    interrupted_turn(store_url, "conv-n")
    tools = Tools()
    chat = chat_for(store_url, fake, conversation_id="conv-n")
    assert [c.started for c in chat.interrupted.pending_calls] == [False, False]  # type: ignore[union-attr]
    chat.retry(tools=tools.all)
    assert tools.runs == [("send_email", "c2"), ("get_weather", "c3")]
    assert [m.status for m in fresh(store_url, "conv-n").messages if m.role == "tool"] == \
        ["complete", "partial", "complete", "complete"]  # c2 marked started before it ran


@pytest.mark.invariant(7)
def test_a_new_turn_answers_the_abandoned_calls_first(store_url: str, fake: FakeModel) -> None:
    interrupted_turn(store_url, "conv-a")
    chat = chat_for(store_url, fake, conversation_id="conv-a")
    chat.send("never mind")
    conv = fresh(store_url, "conv-a")
    assert shape(conv)[3:] == [("tool", "unknown"), ("tool", "unknown"), ("user", "complete"),
                               ("assistant", "complete")]
    assert all("may or may not have run" in m.content for m in conv.messages[3:5])
    assert requests(fake)[-1] == [m.to_openai() for m in conv.messages[:6]]


def test_the_request_never_carries_a_call_without_its_result(store_url: str,
                                                             fake: FakeModel) -> None:
    # c1 answered, c2 not, then the conversation went on: a broken chain, built directly
    seed(store_url, "conv-c", [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "f", {}),
                                                            call("c2", "f", {})]},
        {"role": "tool", "content": "r1", "tool_call_id": "c1"},
        {"role": "assistant", "content": "partly", "tool_calls": [call("c3", "f", {})]},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"}])
    chat_for(store_url, fake, conversation_id="conv-c").send("q3")
    sent = requests(fake)[-1]
    assert sent[1] == {"role": "assistant", "content": None,
                       "tool_calls": [call("c1", "f", {})]}
    assert sent[2] == {"role": "tool", "content": "r1", "tool_call_id": "c1"}
    assert sent[3] == {"role": "assistant", "content": "partly"}  # its lone call left out
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user",
                                         "assistant", "user"]


def test_the_request_never_carries_a_result_without_its_call(store_url: str,
                                                             fake: FakeModel) -> None:
    seed(store_url, "conv-o", [
        {"role": "user", "content": "q1"},
        {"role": "tool", "content": "stray", "tool_call_id": "c9"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "f", {})]},
        {"role": "tool", "content": "r1", "tool_call_id": "c1"},
        {"role": "tool", "content": "other", "tool_call_id": "c8"},
        {"role": "tool", "content": "again", "tool_call_id": "c1"},
        {"role": "assistant", "content": "a1"}])
    chat_for(store_url, fake, conversation_id="conv-o").send("q2")
    sent = requests(fake)[-1]
    tool_ids = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert tool_ids == ["c1"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]


@pytest.mark.invariant(5)
def test_two_writers_compare_and_append_every_loop_message(store_url: str,
                                                           fake: FakeModel) -> None:
    fake.add_tool_rule(contains="weather", calls=CALLS)
    other = chat_for(store_url, fake)
    other.send("hello")
    cid = other.id

    @tool
    def get_weather(city: str) -> str:
        # another writer moves the conversation on while this tool runs
        intruder = chat_for(store_url, fake, conversation_id=cid)
        intruder.add_system("be brief")
        return "sunny"

    chat = chat_for(store_url, fake, conversation_id=cid)
    with pytest.raises(ConflictError):
        chat.send("weather", tools=[get_weather, Tools().send_email])
    conv = fresh(store_url, cid)
    # the loser's result was not written over the winner's message, nor after it
    assert shape(conv)[2:] == [("user", "complete"), ("assistant", "complete"),
                               ("system", "complete")]
    assert not [m for m in conv.messages if m.role == "tool"]


@pytest.mark.invariant(5)
def test_two_writers_completing_one_turn_never_run_a_side_effect_twice(
        store_url: str, fake: FakeModel) -> None:
    interrupted_turn(store_url, "conv-2w")
    first = chat_for(store_url, fake, conversation_id="conv-2w")
    second = chat_for(store_url, fake, conversation_id="conv-2w")  # both loaded, no marker
    inside, release = threading.Event(), threading.Event()
    runs: list[str] = []

    @tool(idempotent=False)
    def send_email(to: str, body: str) -> str:
        runs.append(threading.current_thread().name)
        inside.set()
        assert release.wait(30)
        return "sent"

    tools = [Tools().get_weather, send_email]
    errors: list[BaseException] = []

    def complete_first() -> None:
        try:
            first.retry(tools=tools)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=complete_first, name="first")
    worker.start()
    try:
        assert inside.wait(30)  # the first writer's marker is stored and its tool runs
        with pytest.raises(ConflictError):
            second.retry(tools=tools)  # its marker for the same call loses
    finally:
        release.set()
        worker.join(30)
    assert errors == []
    assert runs == ["first"]
    conv = fresh(store_url, "conv-2w")
    assert [(m.tool_call_id, m.status) for m in conv.messages if m.role == "tool"] == [
        ("c1", "complete"), ("c2", "partial"), ("c2", "complete"), ("c3", "complete")]


def test_tool_schema_from_hints_and_docstring() -> None:
    @tool(idempotent=False, name="lookup")
    def find(query: str, limit: int = 5, exact: bool | None = None) -> list[str]:
        """Search the notes.

        Longer text that is not part of the description.

        Args:
            query: what to look for
            limit: at most this many hits
        """
        return [query] * limit

    spec = find.spec()["function"]
    assert spec["name"] == "lookup"
    assert find.idempotent is False
    assert spec["description"] == "Search the notes."
    params = spec["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string", "description": "what to look for"}
    assert params["properties"]["limit"]["type"] == "integer"
    assert params["properties"]["limit"]["default"] == 5
    assert params["additionalProperties"] is False
    assert find("x", limit=2) == ["x", "x"]  # still callable
    assert find.parse_args({"query": "q", "limit": "3"}) == {"query": "q", "limit": 3,
                                                           "exact": None}
    with pytest.raises(ValueError, match="limit: Input should be a valid integer"):
        find.parse_args({"query": "q", "limit": "many"})
    with pytest.raises(ValueError, match="other: Extra inputs are not permitted"):
        find.parse_args({"query": "q", "other": 1})
    assert tool(len).idempotent is True
    def variadic(*notes: str) -> None: ...

    with pytest.raises(TypeError, match=r"\*args"):
        tool(variadic)
    with pytest.raises(ValueError, match="not valid for the API"):
        tool(name="has space")(lambda: None)


def test_provider_fields_of_a_reply_are_kept(store_url: str) -> None:
    from chatstate import Completion

    class Refusing:
        """An adapter peer whose model refuses, with reasoning (the fake never sends these)."""

        model = "m"

        def complete(self, messages: Any, *, model: str | None = None,
                     params: Any = None) -> Completion:
            return Completion("", "m", None, "stop", None,
                              {"refusal": "I can't help with that.", "reasoning": "policy"})

        def stream(self, messages: Any, **kwargs: Any) -> Iterator[Any]:
            yield self.complete(messages)

    chat = Chat(store_url, adapter=Refusing())
    reply = chat.send("something bad")
    assert reply.extra == {"refusal": "I can't help with that.", "reasoning": "policy"}
    assert fresh(store_url, chat.id).messages[-1].extra == reply.extra
