"""chatstate quick start: two durable turns, then a replay of the verified transcript.

    .venv/bin/python examples/quickstart.py [STORE_URL]

The store is STORE_URL, else CHATSTATE_STORE, else SQLite in your user data
directory. Without CHATSTATE_BASE_URL / OPENAI_BASE_URL it talks to the
built-in fake model, so it runs offline with no key.
"""

import os
import sys

import chatstate
from chatstate.testing import FakeModel

store = chatstate.open_store(sys.argv[1] if len(sys.argv) > 1 else None)
print(f"store {store.url}: {store.guard_report.verdict}")

offline = not (os.environ.get("CHATSTATE_BASE_URL") or os.environ.get("OPENAI_BASE_URL"))
fake = FakeModel(chunk_delay=0.02).start() if offline else None
if fake:
    chat = chatstate.Chat(store, base_url=fake.base_url, api_key="offline")
else:
    chat = chatstate.Chat(store)  # model, base URL and key from the environment

reply = chat.send("What does chatstate promise?")  # a Message, already durable
print(f"assistant> {reply.content}")

print("assistant> ", end="")
for delta in chat.stream("And if the process dies mid-reply?"):
    print(delta, end="", flush=True)  # each delta was stored before it got here
print()

# What a fresh process (or `chatstate replay ID`) reads back:
conversation = store.load(chat.id)
for message in conversation.messages:
    print(f"  [{message.seq}] {message.role}: {message.content}")
verdict = "intact" if conversation.verify() is None else "BROKEN"
print(f"conversation {chat.id}: {len(conversation.messages)} messages, hash chain {verdict}")

if fake:
    fake.close()
