"""Framework items in the chain, and the view a framework sees, computed from the chain.

An item (a Responses API input item of the Agents SDK, or a LangChain message as a
dict) is stored as one Message whose ``extra[KEY]`` holds it verbatim; ``role``,
``content``, ``tool_calls`` and ``tool_call_id`` are derived from it for replay,
search and the tool-loop's pairing, never read back. The item is in the hashed body,
so kinds chatstate does not know are kept, and covered, all the same.

Removing is appending: ``pop`` and ``clear`` are events (chatstate.core.events); the view
is computed from the chain.
Nothing acknowledged is rewritten. Stdlib and chatstate only: no framework import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from chatstate.core.events import shown
from chatstate.core.fields import Role
from chatstate.core.transcript import Message
from chatstate.errors import InvalidInput
from chatstate.session.tool_loop import UNKNOWN

KEY = "item"
"""``extra[KEY]``: the framework's item, verbatim."""

UNKNOWN_OUTPUT = UNKNOWN
"""The output handed back for a call stored without one: the tool loop's own words."""
# Calls the SDK answers with an output item of type f"{type}_output" and the same call_id.
PAIRED_CALLS = ("function_call", "custom_tool_call")

_ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "system": "system",
                           "developer": "system", "tool": "tool"}


def plain(item: Any, where: str) -> dict[str, Any]:
    """The item as plain JSON data (what every store keeps), or a clear error."""
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: an item must be a dict (a JSON object), not "
                           f"{type(item).__name__}; nothing was stored")
    try:
        data: dict[str, Any] = json.loads(json.dumps(item, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{where}: item is not JSON data ({exc}); nothing was "
                           "stored") from exc
    return data


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def fields_of(item: dict[str, Any]) -> dict[str, Any]:
    """Message fields derived from an item (role, content, tool_calls, tool_call_id)."""
    kind = item.get("type")
    if kind in PAIRED_CALLS and isinstance(item.get("call_id"), str):
        arguments = item.get("arguments", item.get("input"))
        fields: dict[str, Any] = {"role": "assistant", "content": ""}
        if isinstance(item.get("name"), str) and isinstance(arguments, str):
            fields["tool_calls"] = [{"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": arguments}}]
        return fields
    if isinstance(kind, str) and kind.endswith("_output") and \
            isinstance(item.get("call_id"), str):
        output = item.get("output")
        return {"role": "tool", "tool_call_id": item["call_id"],
                "content": output if isinstance(output, str) else json.dumps(output)}
    role = _ROLES.get(str(item.get("role")), "assistant")
    text = _text(item.get("content")) or _text(item.get("summary"))
    return {"role": role, "content": text}


Derive = Callable[[dict[str, Any]], dict[str, Any]]


def seal_items(prev: Message | None, items: Sequence[dict[str, Any]], turn_id: str,
               derive: Derive = fields_of) -> list[Message]:
    """Seal items as messages after ``prev`` (one batch, one append)."""
    out: list[Message] = []
    for item in items:
        prev = Message.seal(prev, turn_id=turn_id, extra={KEY: item}, **derive(item))
        out.append(prev)
    return out


def view(messages: Sequence[Message]) -> list[Message]:
    """The item messages the chain shows now (see chatstate.core.events)."""
    return [m for m in shown(messages) if KEY in (m.extra or {}) and m.status == "complete"]


def paired(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Never an orphan: a call without its output is answered "outcome unknown" right
    after it, and an output whose call is not shown is left out (as the tool loop does)."""
    calls = {i.get("call_id") for i in items if i.get("type") in PAIRED_CALLS}
    outputs = {i.get("call_id") for i in items if i.get("type") in _OUTPUTS}
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type")
        if kind in _OUTPUTS and item.get("call_id") not in calls:
            continue
        out.append(item)
        if kind in PAIRED_CALLS and item.get("call_id") not in outputs:
            out.append({"type": f"{kind}_output", "call_id": item.get("call_id"),
                        "output": UNKNOWN_OUTPUT})
    return out


_OUTPUTS = tuple(f"{kind}_output" for kind in PAIRED_CALLS)


def latest(items: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The latest ``limit`` items, oldest first, without an output cut from its call."""
    if limit is None:
        return items
    if limit <= 0:
        return []
    return paired(items[-limit:])
