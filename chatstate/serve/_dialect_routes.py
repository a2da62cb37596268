"""The routes of the wire APIs beside chat completions: ``/v1/responses``, ``/v1/messages``.

Each is the proxy's one turn (``Proxy.chat_completions``) spoken in another
API's shapes (``_wires``); this module only names them, so the app gains them
with one line.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from chatstate.serve._messages import MESSAGES_WIRE
from chatstate.serve._responses import RESPONSES_WIRE

__all__ = ["dialect_routes"]


def dialect_routes(proxy: Any) -> dict[str, Callable[[Request], Awaitable[Response]]]:
    """path -> handler, for ``create_app``'s guarded routes (POST)."""
    return {"/v1/responses": functools.partial(proxy.chat_completions, wire=RESPONSES_WIRE),
            "/v1/messages": functools.partial(proxy.chat_completions, wire=MESSAGES_WIRE)}
