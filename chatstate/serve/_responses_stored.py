"""Stateful Responses through serve, answered from the store: ``previous_response_id``
(the stored history up to that response, sent to a stateless upstream as the whole
input), ``GET /v1/responses/{id}`` and its ``input_items``, each within the caller's
namespace."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from chatstate.core.transcript import Message

_FOUND: dict[tuple[str, str], str] = {}
"""(namespace, response id) -> the conversation id that holds it, once looked up."""


class UnknownResponse(LookupError):
    """No stored reply of this namespace has the response id."""

    def __init__(self, rid: str) -> None:
        super().__init__(rid)
        self.rid = rid


def not_found(rid: str) -> Response:
    """The 404 OpenAI gives for an unknown response id."""
    return JSONResponse({"error": {
        "message": f"Response with id '{rid}' not found.", "type": "invalid_request_error",
        "param": "previous_response_id", "code": "previous_response_not_found"}},
        status_code=404)


def find_response(store: Any, namespace: str, rid: str) -> tuple[Any, int]:
    """(the conversation, the index among its visible messages) of the stored reply whose
    response id is ``rid``; UnknownResponse if this namespace has none."""
    from chatstate.serve._history import namespace_of, visible

    def position(conv: Any) -> int | None:
        if namespace_of(conv) != namespace:
            return None
        for i, message in enumerate(visible(conv)):
            if message.role == "assistant" and (message.extra or {}).get("response_id") == rid:
                return i
        return None

    known = _FOUND.get((namespace, rid))
    if known is not None:
        try:
            conv = store.load(known)
        except LookupError:
            conv = None
        at = position(conv) if conv is not None else None
        if at is not None:
            return conv, at
    for summary in store.list_conversations():
        try:
            conv = store.load(summary.id)
        except LookupError:
            continue
        at = position(conv)
        if at is not None:
            _FOUND[(namespace, rid)] = conv.id
            return conv, at
    raise UnknownResponse(rid)


def history_items(conv: Any, upto: int, instructions: bool) -> list[dict[str, Any]]:
    """The stored conversation up to its reply at ``upto``, as Responses input items.

    A leading system message is left out when the request gives its own instructions,
    and when it was the earlier request's ``instructions``: OpenAI does not carry those
    over to a response that names it as previous (input items it does)."""
    from chatstate.adapter.dialects.responses import encode_input
    from chatstate.serve._history import visible

    kept = visible(conv)[:upto + 1]
    if kept and kept[0].role == "system" and (instructions or _instructed(kept)):
        kept = kept[1:]
    items, _ = encode_input([m.to_openai(blob=lambda part: part, provider=True)
                             for m in kept])
    return items


def _instructed(kept: list[Message]) -> bool:
    """Is ``kept[0]`` (a system message) the first request's ``instructions``, as its
    record (``params["request"]``, on the request's last message) says?"""
    from chatstate.serve._request_record import REQUEST

    for message in kept:
        record = (message.params or {}).get(REQUEST)
        if isinstance(record, dict):
            options = record.get("options")
            return isinstance(options, dict) and options.get("instructions") == kept[0].content
    return False


def expand_previous(store: Any, namespace: str, data: dict[str, Any]) -> dict[str, Any]:
    """A request with ``previous_response_id`` as the stateless request it means: the stored
    history up to that response, then the new input (UnknownResponse if there is none)."""
    rid = data.get("previous_response_id")
    if not isinstance(rid, str) or not rid:
        return data
    conv, at = find_response(store, namespace, rid)
    new = data.get("input")
    if isinstance(new, str):
        new = [{"type": "message", "role": "user", "content": new}]
    expanded = {k: v for k, v in data.items() if k != "previous_response_id"}
    expanded["input"] = history_items(conv, at, bool(data.get("instructions"))) + list(
        new if isinstance(new, list) else [])
    return expanded


def stored_response(store: Any, namespace: str, rid: str) -> Response:
    """``GET /v1/responses/{id}``: the stored reply as a Responses object."""
    from chatstate.serve._history import visible
    from chatstate.serve._responses import response_object  # (it imports this module)

    try:
        conv, at = find_response(store, namespace, rid)
    except UnknownResponse:
        return not_found(rid)
    return JSONResponse(response_object(visible(conv)[at]))


def stored_input_items(store: Any, namespace: str, rid: str) -> Response:
    """``GET /v1/responses/{id}/input_items``: what the response answered, as items."""
    try:
        conv, at = find_response(store, namespace, rid)
    except UnknownResponse:
        return not_found(rid)
    items = history_items(conv, at - 1, False)
    data = [{"id": f"item_{i}", **item} for i, item in enumerate(items)]
    return JSONResponse({"object": "list", "data": data,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": False})
