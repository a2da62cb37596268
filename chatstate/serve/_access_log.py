"""The proxy's access log: one line per request (method, path, status, ms, conversation)."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatstate.serve._wire import CONVERSATION_HEADER

access = logging.getLogger("chatstate.serve.access")


def with_access_log(app: ASGIApp) -> ASGIApp:
    """One log line per request: method, path, status, milliseconds, conversation id."""

    async def logged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        start, status, conversation = time.perf_counter(), 0, None

        async def send_wrapper(message: Message) -> None:
            nonlocal status, conversation
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == CONVERSATION_HEADER.lower().encode():
                        conversation = value.decode()
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        finally:
            fields = {"method": scope["method"], "path": scope["path"], "status": status,
                      "ms": round((time.perf_counter() - start) * 1000, 2),
                      "conversation": conversation}
            access.info("%s %s %s %.1fms", fields["method"], fields["path"], status,
                        fields["ms"], extra={"fields": fields})

    return logged
