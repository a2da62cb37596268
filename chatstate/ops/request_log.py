"""The requests a conversation's turns made, read back from the messages' params.

``chatstate serve`` keeps what each request asked for in ``params["request"]`` of
its last message and how it went in ``params["response"]`` of its reply (or in the
conversation's ``last_upstream_error`` when there is none); ``Chat`` keeps its
request params on the user message (the model on the reply). One row per turn that
asked the model (a user or tool message, or serve's record):
``{"turn_id", "seq", "at", "model", "options", "key"?, "status"?, "duration_ms"?,
"upstream_request_id"?, "reply"?, "error"?}``. Shown by ``chatstate replay
--requests`` and ``GET /v1/chatstate/conversations/{id}?requests=true``.
"""

from __future__ import annotations

import json
from typing import Any

from chatstate.core.transcript import Conversation, Message

UPSTREAM_ERROR_KEY = "last_upstream_error"
"""The conversation metadata where a turn without a reply says why (``TurnWriter``)."""


def requests_of(conv: Conversation) -> list[dict[str, Any]]:
    turns: dict[str, list[Message]] = {}
    for message in [*conv.messages, *([conv.partial] if conv.partial else [])]:
        turns.setdefault(message.turn_id, []).append(message)
    error = conv.metadata.get(UPSTREAM_ERROR_KEY)
    rows = []
    for turn_id, messages in turns.items():
        # a turn asks with its user (or tool) message, serve's with the request's last one;
        # a system message alone (a /system, a compaction's summary) asked nothing
        asked = [m for m in messages if m.role in ("user", "tool") or (
            m.role != "assistant" and (m.params or {}).get("request") is not None)]
        if not asked:
            continue
        carrier = asked[-1]
        params = carrier.params or {}
        record = params.get("request")
        row: dict[str, Any] = {"turn_id": turn_id, "seq": carrier.seq,
                               "at": carrier.created_at}
        if isinstance(record, dict):  # serve's record
            row.update({"model": record.get("model"), "options": record.get("options", {})})
            if "key" in record:
                row["key"] = record["key"]
        elif isinstance(record, str):  # 0.3's serve: the key alone
            row.update({"model": None, "options": {}, "key": record})
        else:  # Chat's request params (none: the model's defaults)
            row.update({"model": params.get("model"), "options": {
                k: v for k, v in params.items() if k != "model"}})
        replies = [m for m in messages if m.role == "assistant"]
        if row["model"] is None and replies and not isinstance(record, dict | str):
            row["model"] = replies[-1].model  # Chat keeps the model on the reply
        if replies:
            reply = replies[-1]
            row.update(dict((reply.params or {}).get("response") or {}))
            row["reply"] = {k: v for k, v in {
                "seq": reply.seq, "status": reply.status, "model": reply.model,
                "usage": dict(reply.usage) if reply.usage else None,
                "finish_reason": reply.finish_reason}.items() if v is not None}
        elif isinstance(error, dict) and error.get("turn_id") == turn_id:
            row.update({k: v for k, v in error.items() if k not in ("turn_id", "detail")})
            row["error"] = error.get("detail")
        rows.append(row)
    return rows


def _option(name: str, value: Any) -> str:
    if name == "tools" and isinstance(value, list):
        names = [str((t.get("function") or {}).get("name", t.get("type", "?")))
                 if isinstance(t, dict) else "?" for t in value]
        return f"tools=[{', '.join(names)}]"
    if name == "response_format" and isinstance(value, dict):
        schema = value.get("json_schema")
        named = f"({schema.get('name')})" if isinstance(schema, dict) and "name" in schema else ""
        return f"response_format={value.get('type')}{named}"
    if isinstance(value, dict | list):
        return f"{name}={json.dumps(value, separators=(',', ':'))}"
    return f"{name}={value}"


def request_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per request, for a terminal."""
    lines = []
    for row in rows:
        parts = [f"seq {row['seq']}", row["at"][:19], f"turn {row['turn_id']}",
                 f"model={row.get('model') or '-'}"]
        if "status" in row:
            parts.append(f"HTTP {row['status']}")
        if "duration_ms" in row:
            parts.append(f"{row['duration_ms']} ms")
        if row.get("upstream_request_id"):
            parts.append(f"upstream id {row['upstream_request_id']}")
        reply = row.get("reply")
        if reply:
            parts.append(f"reply seq {reply['seq']} ({reply['status']})")
        elif row.get("error"):
            parts.append(f"error: {str(row['error'])[:80]}")
        else:
            parts.append("no reply")
        options = " ".join(_option(k, v) for k, v in sorted(row.get("options", {}).items()))
        lines.append("  ".join(parts) + (f"\n    {options}" if options else ""))
    return lines
