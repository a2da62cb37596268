"""The record of a proxied request, kept beside its messages (what ``llm``'s log keeps).

What was asked goes with the request's last message, in ``params["request"]``,
durable before the request leaves: ``{"key", "model", "options"}``, where
``key`` is the request's idempotency key (a keyed digest, ``_identity.request_key``)
and ``options`` every other field of the body as it went upstream (temperature,
``tools``, ``tool_choice``, ``response_format``, ``logprobs``, ``n``, ...), less the
messages, credentials scrubbed. How it went goes with the outcome: on the reply in
``params["response"]`` (``{"status", "duration_ms", "upstream_request_id"}``), or,
when there is no reply, in the conversation's ``last_upstream_error``.
``chatstate.ops.request_log`` reads them back (``replay --requests``, the
conversations API). Stores see only message params: nothing here is theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatstate.session.sendable import storable

REQUEST = "request"
RESPONSE = "response"
REQUEST_ID_HEADERS = ("x-request-id", "request-id")
"""Where an upstream names its id of the request (OpenAI, Anthropic)."""


def request_record(forward: Mapping[str, Any], key: str | None) -> dict[str, Any]:
    """What the request asked for, as stored in its last message's ``params``."""
    options = {k: v for k, v in forward.items() if k not in ("messages", "model")}
    record: dict[str, Any] = storable({"model": forward.get("model"), "options": options})
    if key is not None:
        record["key"] = key
    return record


def key_of(params: Mapping[str, Any] | None) -> str | None:
    """The request key a message's params hold (a record, or the bare key of 0.3)."""
    value = (params or {}).get(REQUEST)
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("key"), str):
        return str(value["key"])
    return None


def request_id(upstream: Mapping[str, str]) -> str | None:
    """The upstream's id of the request, if it sent one."""
    return next((upstream[n] for n in REQUEST_ID_HEADERS if n in upstream), None)


def outcome(status: int, seconds: float, upstream: Mapping[str, str] | None) -> dict[str, Any]:
    """How the upstream answered: HTTP status, duration, the upstream's request id."""
    found: dict[str, Any] = {"status": status, "duration_ms": round(seconds * 1000)}
    rid = request_id(upstream) if upstream is not None else None
    if rid is not None:
        found["upstream_request_id"] = rid
    return found
