"""LangChain with chatstate as its chat history: the one-line swap, two turns and a tool call.

    .venv/bin/python examples/langchain_history.py [STORE_URL]

Needs langchain-core (``pip install 'chatstate[langchain]'``). The model is
langchain-core's own fake chat model, so it runs offline with no key; the history
is chatstate's: every add_messages batch is durable and atomic, and a later
process (or ``chatstate replay``) reads it back.
"""

import sys
import warnings

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from chatstate.integrations.langchain import ChatstateChatMessageHistory

warnings.filterwarnings("ignore", message=".*deprecated.*")  # RunnableWithMessageHistory
store = sys.argv[1] if len(sys.argv) > 1 else None  # None: CHATSTATE_STORE or the default

model = GenericFakeChatModel(messages=iter([
    AIMessage(content="", tool_calls=[{"name": "weather", "args": {"city": "Paris"},
                                       "id": "call_1", "type": "tool_call"}]),
    AIMessage(content="It is sunny in Paris."),
    AIMessage(content="You asked about Paris."),
]))
prompt = ChatPromptTemplate.from_messages([("system", "You answer about weather."),
                                           MessagesPlaceholder("history"),
                                           MessagesPlaceholder("input")])
chain = RunnableWithMessageHistory(
    prompt | model,
    lambda session_id: ChatstateChatMessageHistory(session_id, store=store),  # the swap
    input_messages_key="input", history_messages_key="history")
config = {"configurable": {"session_id": "langchain-demo"}}

call = chain.invoke({"input": [HumanMessage("Weather in Paris?")]}, config)
print("tool call:", call.tool_calls[0]["name"], call.tool_calls[0]["args"])
result = ToolMessage("sunny, 21°C", tool_call_id=call.tool_calls[0]["id"])
print("assistant>", chain.invoke({"input": [result]}, config).content)
print("assistant>", chain.invoke({"input": [HumanMessage("Which city?")]}, config).content)

history = ChatstateChatMessageHistory("langchain-demo", store=store)  # a fresh reader
for message in history.messages:
    print(f"  {type(message).__name__}: {message.content or message.tool_calls}")
conversation = history.store.load("langchain-demo")
verdict = "intact" if conversation.verify() is None else "BROKEN"
print(f"conversation langchain-demo: {len(conversation.messages)} messages, hash chain {verdict}")
history.close()
