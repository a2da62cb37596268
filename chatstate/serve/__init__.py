"""``chatstate serve``: an OpenAI-compatible proxy that persists every conversation first.

Point any OpenAI client's base URL at it. Each request's new messages are durable
before the request goes upstream, and each streamed chunk is durable before the
client receives it, so what a client received is always a prefix of what the
store holds. Needs the ``serve`` extra (uvicorn, Starlette).
"""

from __future__ import annotations

from chatstate.serve._access_log import with_access_log
from chatstate.serve._auth import check_tokens
from chatstate.serve._wire import CONVERSATION_HEADER
from chatstate.serve.app import ServeConfig, create_app

__all__ = ["CONVERSATION_HEADER", "ServeConfig", "check_tokens", "create_app",
           "with_access_log"]
