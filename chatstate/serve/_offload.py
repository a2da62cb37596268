"""CPU work of a request, off the event loop, with caps on what it may cost.

Parsing, checking and digesting a body is proportional to its size: an 8.5 MB
body of 200,001 messages held the event loop (every other client) for seconds.
``parse_request`` runs in a worker thread and refuses, before any of it is kept,
a body with more messages than ``max_messages`` (413) or JSON nested deeper than
``max_depth`` (400; that includes a body the JSON parser itself cannot nest), and
``NaN``/``Infinity`` (400: not JSON, and the upstream request could not carry them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGES = 10_000
MAX_DEPTH = 64


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    param: str | None = None  # the request field at fault, as OpenAI's errors name it


def nesting_depth(value: object, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), counting no further than ``limit + 1``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth) for child in children
                     if isinstance(child, dict | list))
    return deepest


def parse_request(body: bytes, *, max_messages: int = MAX_MESSAGES,
                  max_depth: int = MAX_DEPTH) -> Any:
    """The body as JSON, or a Refusal (blocking: run it in a worker thread)."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        return Refusal(400, f"the request body is nested deeper than {max_depth} levels "
                       "(--max-depth)")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return Refusal(400, f"the request body is not JSON ({exc})")
    except ValueError as exc:  # NaN or Infinity (``_no_constant``)
        return Refusal(400, str(exc))
    messages = data.get("messages") if isinstance(data, dict) else None
    if isinstance(messages, list) and len(messages) > max_messages:
        return Refusal(413, f"the request has {len(messages)} messages, over the limit of "
                       f"{max_messages} (--max-messages)")
    if nesting_depth(data, max_depth) > max_depth:
        return Refusal(400, f"the request body is nested deeper than {max_depth} levels "
                       "(--max-depth)")
    return data


def _no_constant(name: str) -> Any:
    # Python's json takes NaN and Infinity; JSON, the upstream and encode_json do not.
    # Refused here, before the request's messages are stored.
    raise ValueError(f"the request body has {name}, which is not JSON: send a number or null")


JSON = {"Content-Type": "application/json"}


def encode_json(value: Any) -> bytes:
    """The upstream request body, encoded as httpx2's ``json=`` would (blocking); one
    that holds half a character (a lone surrogate, which the client's JSON escaped) goes
    with every non-ASCII character escaped, as the client could only have sent it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
