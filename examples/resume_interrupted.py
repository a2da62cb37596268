"""Resume an interrupted turn: the question was stored before the model was asked.

    .venv/bin/python examples/resume_interrupted.py [STORE_URL]

The built-in fake model drops the stream after a few chunks, with retries off,
so the turn fails halfway. A new Chat on the same conversation (as a restarted
process would open it) finds the interrupted turn, and retry() completes it
under the same turn id: no second copy of the question, the cut-off reply kept
as a partial.
"""

import sys

import chatstate
from chatstate.testing import FakeModel

store = chatstate.open_store(sys.argv[1] if len(sys.argv) > 1 else None)

with FakeModel(chunk_delay=0.02) as fake:
    model = chatstate.make_adapter(base_url=fake.base_url, api_key="offline", max_retries=0)
    chat = chatstate.Chat(store, adapter=model)

    fake.cut_stream_next(after_chunks=4)  # the connection drops mid-reply
    print("assistant> ", end="")
    try:
        for delta in chat.stream("Explain write-ahead logging."):
            print(delta, end="", flush=True)
    except chatstate.ModelError as exc:
        print(f"\nfailed: {exc}")

    # Later, perhaps in another process: opening the conversation is recovery.
    chat = chatstate.Chat(store, conversation_id=chat.id, adapter=model)
    print(f"found: {chat.interrupted.describe()}")
    reply = chat.retry()
    print(f"retried> {reply.content}")

for message in store.load(chat.id).messages:
    print(f"  [{message.seq}] {message.role} ({message.status}): {message.content}")
