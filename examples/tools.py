"""Tools: the model calls them, every step is stored first, and a crash is safe.
    .venv/bin/python examples/tools.py [STORE_URL]
Offline, with the fake model scripted to call both tools. get_weather is idempotent;
send_email is not, so recovery never runs it twice.
"""

import sys

import chatstate
from chatstate.testing import FakeModel


@chatstate.tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: the city's name, e.g. "Paris"
    """
    return f"sunny and 21 C in {city}"


@chatstate.tool(idempotent=False)
def send_email(to: str, body: str) -> str:
    """Send an email (a side effect: never run twice)."""
    return f"email to {to} sent"


@chatstate.tool(idempotent=False, name="send_email")
def send_email_killed(to: str, body: str) -> str:
    raise KeyboardInterrupt  # the process is interrupted while the email goes out


def show(message: chatstate.Message) -> None:  # called once each call/result is stored
    for call in message.tool_calls or ():
        print(f"  tool call   {call['function']['name']}({call['function']['arguments']})")
    if message.role == "tool":
        print(f"  tool result {message.content} [{message.status}]")


store = chatstate.open_store(sys.argv[1] if len(sys.argv) > 1 else None)
with FakeModel() as fake:
    fake.add_tool_rule(contains="weather", text="Let me check. ", calls=[
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "send_email", "arguments": {"to": "ann@example.com", "body": "Sunny!"}}])
    chat = chatstate.Chat(store, base_url=fake.base_url, api_key="offline", on_tool=show)
    reply = chat.send("What's the weather in Paris? Email Ann.",
                      tools=[get_weather, send_email])
    print(f"assistant> {reply.content}")
    try:
        chat.send("And tomorrow's weather? Email Ann again.",
                  tools=[get_weather, send_email_killed])
    except KeyboardInterrupt:
        print("(interrupted while send_email ran)")
    chat = chatstate.Chat(store, conversation_id=chat.id, base_url=fake.base_url,
                          api_key="offline", on_tool=show)  # as a restarted process would
    print(f"on reopening: {chat.interrupted.describe()}")  # type: ignore[union-attr]
    reply = chat.retry(tools=[get_weather, send_email])  # send_email is not run again
    print(f"assistant> {reply.content}")
print(f"{len(chat.messages)} messages, chain intact: {store.load(chat.id).verify() is None}")
