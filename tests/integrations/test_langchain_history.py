"""ChatstateChatMessageHistory: LangChain messages round-trip through every store;
RunnableWithMessageHistory over two turns and a tool call; clear is an event."""

from __future__ import annotations

import asyncio
import warnings

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is not installed "
                    "(chatstate[langchain])")

from langchain_core.language_models.fake_chat_models import (
    GenericFakeChatModel,
)
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

from chatstate.integrations.langchain import ChatstateChatMessageHistory

warnings.filterwarnings("ignore", category=DeprecationWarning, module="langchain_core")

RICH = [
    SystemMessage(content="You are terse."),
    HumanMessage(content=[{"type": "text", "text": "What is in this picture?"},
                          {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]),
    AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": "é", "n": 2.5},
                                       "id": "call_1", "type": "tool_call"}],
              additional_kwargs={"refusal": None}, response_metadata={"model": "m"}),
    ToolMessage(content="a cat", tool_call_id="call_1", name="lookup", status="success"),
    AIMessage(content=[{"type": "text", "text": "A cat."}], id="run-1"),
]


def test_messages_round_trip_on_every_store(store_url: str) -> None:
    history = ChatstateChatMessageHistory("lc-1", store=store_url)
    history.add_messages(RICH)
    again = ChatstateChatMessageHistory("lc-1", store=store_url)
    assert [message_to_dict(m) for m in again.messages] == [message_to_dict(m) for m in RICH]
    assert again.messages[2].tool_calls[0]["args"] == {"q": "é", "n": 2.5}
    assert isinstance(again.messages[3], ToolMessage)
    # derived fields make the transcript readable by chatstate (replay, search, pairing)
    conv = again.store.load("lc-1")
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool",
                                               "assistant"]
    assert conv.messages[2].tool_calls[0]["id"] == "call_1"
    assert conv.messages[3].tool_call_id == "call_1"
    history.close()
    again.close()


def test_add_messages_is_one_append_and_clear_is_an_event(store_url: str) -> None:
    history = ChatstateChatMessageHistory("lc-2", store=store_url)
    history.add_messages([HumanMessage(content="one"), AIMessage(content="two")])
    conv = history.store.load("lc-2")
    assert len({m.turn_id for m in conv.messages}) == 1  # one batch, one append
    history.clear()
    assert history.messages == []
    history.add_messages([HumanMessage(content="three")])
    assert [m.content for m in history.messages] == ["three"]
    conv = history.store.load("lc-2")
    assert [m.role for m in conv.messages] == ["user", "assistant", "event", "user"]
    assert conv.verify() is None
    history.close()


def test_async_variants(store_url: str) -> None:
    history = ChatstateChatMessageHistory("lc-3", store=store_url)

    async def main() -> list[str]:
        await history.aadd_messages([HumanMessage(content="a"), AIMessage(content="b")])
        got = [str(m.content) for m in await history.aget_messages()]
        await history.aclear()
        assert await history.aget_messages() == []
        return got

    assert asyncio.run(main()) == ["a", "b"]
    history.close()


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_runnable_with_message_history_two_turns_and_a_tool_call(store_url: str) -> None:
    from langchain_core.runnables.history import RunnableWithMessageHistory

    replies = iter([
        AIMessage(content="", tool_calls=[{"name": "weather", "args": {"city": "Paris"},
                                           "id": "call_w", "type": "tool_call"}]),
        AIMessage(content="Sunny in Paris."),
        AIMessage(content="You asked about Paris."),
    ])
    model = GenericFakeChatModel(messages=replies)
    seen: list[list[str]] = []

    def record(prompt_value):  # what the model is sent on each call
        seen.append([str(m.content) for m in prompt_value.to_messages()])
        return prompt_value

    prompt = ChatPromptTemplate.from_messages([
        ("system", "You answer about weather."), MessagesPlaceholder("history"),
        MessagesPlaceholder("input")])
    histories: dict[str, ChatstateChatMessageHistory] = {}

    def get_history(session_id: str) -> ChatstateChatMessageHistory:
        return histories.setdefault(session_id,
                                    ChatstateChatMessageHistory(session_id, store=store_url))

    chain = RunnableWithMessageHistory(prompt | record | model, get_history,
                                       input_messages_key="input",
                                       history_messages_key="history")
    config = {"configurable": {"session_id": "lc-run"}}
    call = chain.invoke({"input": [HumanMessage(content="Weather in Paris?")]}, config)
    assert call.tool_calls[0]["id"] == "call_w"
    answer = chain.invoke({"input": [ToolMessage(content="sunny", tool_call_id="call_w")]},
                          config)
    assert answer.content == "Sunny in Paris."
    last = chain.invoke({"input": [HumanMessage(content="Which city did I ask about?")]},
                        config)
    assert last.content == "You asked about Paris."
    # The third call saw the first two turns, tool call and result included.
    assert "Weather in Paris?" in seen[2]
    assert "sunny" in seen[2]
    fresh = ChatstateChatMessageHistory("lc-run", store=store_url)
    kinds = [type(m).__name__ for m in fresh.messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "HumanMessage",
                     "AIMessage"]
    assert fresh.messages[1].tool_calls[0]["args"] == {"city": "Paris"}
    fresh.close()
    for h in histories.values():
        h.close()
