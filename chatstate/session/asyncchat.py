"""AsyncChat: Chat for asyncio callers, without a second copy of the turn logic.

Every blocking step (store writes, model I/O) runs in a worker thread via
``asyncio.to_thread``; a streamed turn advances the synchronous generator one
delta at a time, so persist-before-render holds exactly as in ``Chat``. A
cancelled consumer closes the generator, which stores the partial reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from contextlib import suppress
from typing import Any

from chatstate.core.transcript import Message
from chatstate.session.chat import Chat, Interrupted
from chatstate.stores.base import Store

_DONE = object()


class AsyncChat:
    """``AsyncChat.open(...)`` takes the same arguments as ``Chat``."""

    def __init__(self, chat: Chat) -> None:
        self.chat = chat

    @classmethod
    async def open(cls, store: Store | str | None = None, **kwargs: Any) -> AsyncChat:
        return cls(await asyncio.to_thread(Chat, store, **kwargs))

    @property
    def id(self) -> str:
        return self.chat.id

    @property
    def messages(self) -> list[Message]:
        return self.chat.messages

    @property
    def interrupted(self) -> Interrupted | None:
        return self.chat.interrupted

    @property
    def cut_short(self) -> Message | None:
        return self.chat.cut_short

    async def send(self, text: str | list[dict[str, Any]], **params: Any) -> Message:
        """As ``Chat.send`` (``attach=`` included)."""
        return await asyncio.to_thread(self.chat.send, text, **params)

    async def retry(self, **params: Any) -> Message:
        return await asyncio.to_thread(self.chat.retry, **params)

    async def stream(self, text: str | list[dict[str, Any]],
                     **params: Any) -> AsyncGenerator[str, None]:
        gen = await asyncio.to_thread(self.chat.stream, text, **params)
        async for delta in _drive(gen):
            yield delta

    async def retry_stream(self, **params: Any) -> AsyncGenerator[str, None]:
        gen = await asyncio.to_thread(self.chat.retry_stream, **params)
        async for delta in _drive(gen):
            yield delta


async def _drive(gen: Generator[str, None, None]) -> AsyncGenerator[str, None]:
    step: asyncio.Future[object] | None = None
    try:
        while True:
            step = asyncio.ensure_future(asyncio.to_thread(next, gen, _DONE))
            delta = await asyncio.shield(step)
            if delta is _DONE:
                return
            yield str(delta)
    finally:
        # A cancelled consumer: let the step in flight finish (a generator cannot be
        # closed while it runs), then close it: GeneratorExit in the turn saves the partial.
        if step is not None and not step.done():
            with suppress(BaseException):
                await step
        await asyncio.to_thread(gen.close)
