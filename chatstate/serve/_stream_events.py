"""How each wire API's stream says it failed after it began: read and written here only.

A relayed stream that fails (the upstream connection drops, its body ends with no
finish, or it sends its own error event) is kept as the partial reply and recorded
(``_relay``); then the client is told, in the shape of the API it speaks, so its SDK
sees a failure instead of a short reply it would take as complete:

- chat completions: ``data: {"error": {...}}`` (the openai SDK raises ``APIError``);
- Responses: ``event: error`` (``type``, ``code``, ``message``, ``param``,
  ``sequence_number``), then ``event: response.failed`` with the response object,
  ``status: "failed"``, its ``error`` and the text so far as its output (the openai
  SDK's ``get_final_response`` raises; the Agents SDK raises on the error event);
- Anthropic Messages: ``event: error`` with ``{"type": "error", "error": {"type":
  "api_error" | "overloaded_error" | ..., "message"}}`` (the anthropic SDK raises).

One ``StreamEvents`` per relayed stream watches the events it relays (``see``): it
says which one is the upstream's own error event and what status it stands for (to
record), and remembers what a closing event needs (the response id, the next
sequence number). ``closing`` then writes only what the client has not had: nothing
after the upstream's own chat or Anthropic error event, only ``response.failed``
after a Responses ``error`` the upstream sent without one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from chatstate.serve._errors import stream_error

__all__ = ["ANTHROPIC_KINDS", "AnthropicEvents", "ChatEvents", "ResponsesEvents",
           "StreamEvents", "anthropic_kind"]

ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error",
                   409: "invalid_request_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
"""HTTP status -> Anthropic's error ``type`` (and back, for an upstream's error event)."""
_ANTHROPIC_STATUS = {kind: status for status, kind in ANTHROPIC_KINDS.items()
                     if status != 409}
_RESPONSES_STATUS = {"rate_limit_exceeded": 429, "server_error": 500, "overloaded": 529,
                     "invalid_request_error": 400}


def anthropic_kind(status: int) -> str:
    return ANTHROPIC_KINDS.get(status, "api_error" if status >= 500 else
                               "invalid_request_error")


def _status(code: object, known: Mapping[str, int]) -> int:
    """The HTTP status an error event's code stands for (502: the upstream failed)."""
    if isinstance(code, int) and 400 <= code < 600:
        return code
    if isinstance(code, str) and code.isdigit() and 400 <= int(code) < 600:
        return int(code)
    return known.get(str(code), 502)


def _named(name: str, payload: Mapping[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


class StreamEvents:
    """Chat completions' failure events (the base: unnamed ``{"error": ...}`` events)."""

    def __init__(self) -> None:
        self.errored = False  # the upstream's own error event was relayed

    def see(self, name: str | None, event: object) -> tuple[int, str] | None:
        """Note an upstream event as relayed; (status, message) if it reports a failure."""
        error = event.get("error") if isinstance(event, dict) else None
        if not error:
            return None
        self.errored = True
        if not isinstance(error, dict):
            return 502, str(error)[:500]
        return _status(error.get("code"), {}), str(error.get("message") or error)[:500]

    def closing(self, status: int, message: str, text: str) -> bytes:
        """The events that end the client's stream after a failure (``text``: the reply so
        far, kept as partial); none beyond the upstream's own error event."""
        return b"" if self.errored else stream_error(message)


ChatEvents = StreamEvents


class ResponsesEvents(StreamEvents):
    """The Responses API's: ``error``, then ``response.failed``."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = False  # the upstream sent response.failed itself
        self.response: dict[str, Any] = {}  # as response.created gave it
        self.next_seq = 0
        self.message_id: str | None = None

    def see(self, name: str | None, event: object) -> tuple[int, str] | None:
        if not isinstance(event, dict):
            return None
        kind = event.get("type") or name
        if isinstance(event.get("sequence_number"), int):
            self.next_seq = event["sequence_number"] + 1
        response = event.get("response")
        if kind in ("response.created", "response.in_progress") and isinstance(response, dict):
            self.response = dict(response)
        item = event.get("item")
        if kind == "response.output_item.added" and isinstance(item, dict) and \
                item.get("type") == "message" and self.message_id is None:
            self.message_id = str(item.get("id") or "")
        if kind == "error":  # flat as the spec has it, or nested as some servers send it
            self.errored = True
            nested = event.get("error")
            error: dict[str, Any] = nested if isinstance(nested, dict) else event
            return (_status(error.get("code"), _RESPONSES_STATUS),
                    str(error.get("message") or error.get("code") or "error")[:500])
        if kind == "response.failed":
            self.ended = True
            given = response.get("error") if isinstance(response, dict) else None
            error = given if isinstance(given, dict) else {}
            return (_status(error.get("code"), _RESPONSES_STATUS),
                    str(error.get("message") or "the response failed")[:500])
        return None

    def closing(self, status: int, message: str, text: str) -> bytes:
        code = "rate_limit_exceeded" if status == 429 else (
            "server_error" if status >= 500 else "invalid_request_error")
        out = b""
        if not self.errored:
            out += _named("error", {"type": "error", "code": code, "message": message,
                                    "param": None, "sequence_number": self._seq()})
        if not self.ended:
            output = [{"type": "message", "id": self.message_id or "msg_failed",
                       "status": "incomplete", "role": "assistant",
                       "content": [{"type": "output_text", "text": text,
                                    "annotations": []}]}] if text else []
            response = {"id": "resp_failed", "object": "response",
                        "created_at": int(time.time()), "model": "", **self.response,
                        "status": "failed", "output": output,
                        "error": {"code": code, "message": message},
                        "incomplete_details": None}
            out += _named("response.failed", {"type": "response.failed",
                                              "sequence_number": self._seq(),
                                              "response": response})
        return out

    def _seq(self) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq


class AnthropicEvents(StreamEvents):
    """Anthropic Messages': one ``error`` event."""

    def see(self, name: str | None, event: object) -> tuple[int, str] | None:
        if not isinstance(event, dict) or (event.get("type") or name) != "error":
            return None
        self.errored = True
        given = event.get("error")
        error: dict[str, Any] = given if isinstance(given, dict) else {}
        return (_status(error.get("type"), _ANTHROPIC_STATUS),
                str(error.get("message") or error.get("type") or "error")[:500])

    def closing(self, status: int, message: str, text: str) -> bytes:
        if self.errored:
            return b""
        return _named("error", {"type": "error", "error": {"type": anthropic_kind(status),
                                                           "message": message}})
