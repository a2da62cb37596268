"""A 2,001-message conversation keeps working: each request is fitted to the context window.

    .venv/bin/python examples/long_conversation.py [STORE_URL]

Seeds a conversation (a system message and 1,000 turns) into the store, then
sends one more message to the built-in fake model, which enforces a 4,096-token
window and answers 400 past it, as OpenAI does. chatstate learns the window
from that error, keeps it in the conversation's metadata, and retries once
with the system message and the newest whole turns that fit. The store keeps
every message.
"""

import sys

import chatstate
from chatstate.core.transcript import Message, new_id, new_turn_id
from chatstate.testing import FakeModel

store = chatstate.open_store(sys.argv[1] if len(sys.argv) > 1 else None)
cid = new_id("long")
messages: list[Message] = []


def add(role: str, content: str, turn: str, **extra: object) -> None:
    messages.append(Message.seal(messages[-1] if messages else None, role=role,  # type: ignore[arg-type]
                                 content=content, turn_id=turn, **extra))  # type: ignore[arg-type]


add("system", "You are a patient tutor.", new_turn_id())
for n in range(1000):
    turn = new_turn_id()
    add("user", f"question {n}: how do tides work near estuary {n}?", turn)
    answer = f"answer {n}: the moon pulls the water, twice a day."
    add("assistant", answer, turn, usage={"completion_tokens": len(answer.split())})
store.create(chatstate.Conversation(id=cid, title="a long conversation"))
store.append(cid, messages)
print(f"conversation {cid}: {len(messages)} messages stored")

with FakeModel(context_window=4096) as fake:
    chat = chatstate.Chat(store, conversation_id=cid, model="fake-model",
                          base_url=fake.base_url, api_key="offline")
    reply = chat.send("what about rivers?")
    for entry in fake.request_log:
        print(f"request: {len(entry['messages'])} messages -> HTTP {entry['status']}")
    print(chat.last_fit.describe())
    print(f"learned: {chat.conversation.metadata['context_window']}")
    print(f"assistant> {reply.content}")
print(f"stored: {len(store.load(cid).messages)} messages (nothing was dropped)")
store.close()
