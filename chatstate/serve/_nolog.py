"""A request that asks not to be stored is refused: serve exists to store every turn.

``chatstate ask --no-log`` sends a turn without storing it. Through the proxy that is a
promise serve cannot keep (it persists before it forwards), so the header that asks for
it gets a 400 before anything is stored or sent, rather than a turn stored anyway.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from chatstate.serve._errors import error_for

NO_LOG_HEADER = "X-Chatstate-No-Log"
_YES = ("1", "true", "yes", "on")


def no_log_refusal(request: Request) -> Response | None:
    """The 400 for a request that asks not to be stored, else None."""
    if request.headers.get(NO_LOG_HEADER, "").strip().lower() not in _YES:
        return None
    return error_for(request.url.path, 400, f"{NO_LOG_HEADER}: chatstate serve stores every "
                     "turn before it goes upstream, so it cannot send one unstored; nothing "
                     "was stored or sent. Send this request to the upstream directly, or use "
                     "`chatstate ask --no-log`.", param=NO_LOG_HEADER)
