"""The routes of the wire APIs beside chat completions: ``/v1/responses``, ``/v1/messages``.

Each is the proxy's one turn (``Proxy.chat_completions``) spoken in another
API's shapes (``_wires``); this module only names them, so the app gains them
with one line.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from chatstate.serve._messages import MESSAGES_WIRE
from chatstate.serve._responses import RESPONSES_WIRE
from chatstate.serve._responses_stored import stored_input_items, stored_response

__all__ = ["dialect_routes"]


def dialect_routes(proxy: Any) -> dict[str, Callable[[Request], Awaitable[Response]]]:
    """path -> handler, for ``create_app``'s guarded routes (POST the turns; GET a stored
    response and its input items, from the store, within the caller's namespace)."""

    def reading(read: Callable[[Any, str, str], Response]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            return await asyncio.to_thread(read, proxy.config.store, request.state.namespace,
                                           request.path_params["rid"])
        return handler

    return {"/v1/responses": functools.partial(proxy.chat_completions, wire=RESPONSES_WIRE),
            "/v1/messages": functools.partial(proxy.chat_completions, wire=MESSAGES_WIRE),
            "/v1/responses/{rid}": reading(stored_response),
            "/v1/responses/{rid}/input_items": reading(stored_input_items)}
