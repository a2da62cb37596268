"""AsyncChat: the same durable turns from asyncio, several conversations at once.

    .venv/bin/python examples/async_chat.py [STORE_URL]

The store is STORE_URL, else CHATSTATE_STORE, else SQLite in your user data
directory. Uses the built-in fake model, so it runs offline with no key.
"""

import asyncio
import sys

import chatstate
from chatstate.testing import FakeModel


async def talk(store: chatstate.Store, base_url: str, topic: str) -> str:
    chat = await chatstate.AsyncChat.open(store, base_url=base_url, api_key="offline")
    await chat.send(f"Tell me about {topic}.")  # durable before it returns
    tail = ""
    async for delta in chat.stream("Go on."):  # each delta durable before it arrives
        tail += delta
    return f"{chat.id}: {len(chat.messages)} messages, last reply {tail!r}"


async def main(store_url: str | None) -> None:
    store = chatstate.open_store(store_url)
    with FakeModel(chunk_delay=0.02) as fake:
        # Two conversations stream at the same time, each in its own task.
        for line in await asyncio.gather(talk(store, fake.base_url, "fsync"),
                                         talk(store, fake.base_url, "rename")):
            print(line)
    store.close()


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
