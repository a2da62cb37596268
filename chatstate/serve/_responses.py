"""``POST /v1/responses`` through serve: the OpenAI Responses API, persisted first.

The request's input items are read into the stored (chat-completions) form:
``instructions`` and system/developer items are system messages, message items
user or assistant messages (parts as chatstate's), ``function_call`` items the
assistant's tool calls, ``function_call_output`` items ``tool`` messages by
``call_id``, and reasoning items ride on the assistant message they precede
(``extra["reasoning_items"]``). Then it is the same turn as a chat completion
(``app.Proxy._chat``). The upstream's stream is relayed complete to the spec
whatever the upstream sends: an event without ``output_index`` or
``sequence_number`` (llama.cpp omits them) gets them filled in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from chatstate.adapter.dialects.responses import RESPONSES, ResponsesStream, parse_response
from chatstate.core.transcript import Message
from chatstate.serve._replay import REPLAYED_HEADER
from chatstate.serve._responses_stored import expand_previous
from chatstate.serve._stream_events import ResponsesEvents
from chatstate.serve._wire import openai_error
from chatstate.serve._wires import Wire, stored_reply

__all__ = ["RESPONSES_WIRE", "request_messages"]


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "input_image":
        inner: dict[str, Any] = {"url": part.get("image_url")}
        if part.get("detail"):
            inner["detail"] = part["detail"]
        return {"type": "image_url", "image_url": inner}
    if kind == "input_file":
        return {"type": "file", "file": {k: part[k] for k in ("file_data", "filename",
                                                              "file_id") if k in part}}
    return dict(part)


def _content(content: object) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError("a message item's content must be a string or a list of parts")
    parts = [_part(p) for p in content if isinstance(p, Mapping)]
    if all(p.get("type") == "text" for p in parts):
        return "".join(str(p["text"]) for p in parts)
    return parts


def request_messages(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stored-form messages of a Responses request (ValueError if misshapen)."""
    messages: list[dict[str, Any]] = []
    if isinstance(data.get("instructions"), str) and data["instructions"]:
        messages.append({"role": "system", "content": data["instructions"]})
    items = data.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ValueError("'input' must be a string or a non-empty list of items")
    reasoning: list[dict[str, Any]] = []

    def assistant() -> dict[str, Any]:
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": ""}
            messages.append(last)
        if reasoning:
            last.setdefault("reasoning_items", []).extend(reasoning)
            reasoning.clear()
        return last

    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValueError(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role"))
            if role == "assistant":
                message = assistant()
                message["content"] = str(message.get("content") or "") + \
                    str(_content(item.get("content")) or "")
            else:
                messages.append({"role": role, "content": _content(item.get("content"))})
        elif kind == "function_call":
            assistant().setdefault("tool_calls", []).append({
                "id": str(item.get("call_id")), "type": "function",
                "function": {"name": str(item.get("name")),
                             "arguments": str(item.get("arguments", ""))}})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")),
                             "content": output if isinstance(output, str)
                             else _content(output)})
        elif kind == "reasoning":
            reasoning.append(dict(item))
        # hosted tool items (web search, ...) are relayed upstream, not stored as messages
    if not any(m["role"] == "user" or m["role"] == "tool" for m in messages):
        raise ValueError("'input' holds no user message or function_call_output")
    return messages


def _fields(data: object) -> dict[str, Any]:
    try:
        return stored_reply(parse_response(data))
    except Exception as exc:  # AttemptFailed: a misshapen or failed response
        raise ValueError(str(exc)) from exc


def _holds(event: object) -> bool:
    return isinstance(event, Mapping) and event.get("type") == "response.output_item.added" \
        and isinstance(event.get("item"), Mapping) and event["item"].get("type") == \
        "function_call"


def complete_events() -> Any:
    """A rewriter that gives every event its ``sequence_number`` and every item event its
    ``output_index`` (by item id, in the order the items were added)."""
    indexes: dict[str, int] = {}
    seq = [0]

    def rewrite(name: str | None, event: Any) -> Any:
        if not isinstance(event, dict):
            return event
        kind = str(event.get("type") or name or "")
        event.setdefault("type", kind)
        if "sequence_number" not in event:
            event["sequence_number"] = seq[0]
        seq[0] = int(event["sequence_number"]) + 1
        item = event.get("item") if isinstance(event.get("item"), dict) else None
        item_id = event.get("item_id") or (item or {}).get("id")
        if kind == "response.output_item.added":
            if "output_index" not in event:
                event["output_index"] = len(indexes)
            if isinstance(item_id, str):
                indexes[item_id] = int(event["output_index"])
        elif kind.startswith(("response.output_", "response.content_part",
                              "response.function_call", "response.reasoning")) \
                and "output_index" not in event:
            event["output_index"] = indexes.get(str(item_id), max(len(indexes) - 1, 0))
        if kind.startswith(("response.output_text", "response.content_part")):
            event.setdefault("content_index", 0)
        return event

    return rewrite


def response_object(reply: Message, status: str | None = None) -> dict[str, Any]:
    """A stored reply as a Responses object (for a replayed request and ``GET``)."""
    extra = reply.extra or {}
    output: list[dict[str, Any]] = [dict(i) for i in extra.get("reasoning_items") or ()]
    if reply.text or not reply.tool_calls:
        output.append({"type": "message", "id": f"msg_{reply.turn_id}", "status": "completed",
                       "role": "assistant", "content": [{"type": "output_text",
                                                         "text": reply.text, "annotations": []}]})
    for i, call in enumerate(reply.tool_calls or ()):
        function = call.get("function") or {}
        output.append({"type": "function_call", "id": f"fc_{reply.turn_id}_{i}",
                       "call_id": call.get("id"), "name": function.get("name"),
                       "arguments": function.get("arguments", ""), "status": "completed"})
    cut = reply.finish_reason in ("length", "content_filter")
    usage = reply.usage or {}
    return {
        "id": str(extra.get("response_id") or f"resp_{reply.turn_id}"), "object": "response",
        "created_at": int(time.time()), "status": status or ("incomplete" if cut else
                                                             "completed"),
        "error": None, "incomplete_details": {"reason": "max_output_tokens"
                                              if reply.finish_reason == "length"
                                              else "content_filter"} if cut else None,
        "instructions": None, "metadata": {}, "model": reply.model or "", "output": output,
        "parallel_tool_calls": True, "temperature": None, "tool_choice": "auto", "tools": [],
        "top_p": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                  "output_tokens": usage.get("completion_tokens", 0),
                  "total_tokens": usage.get("total_tokens", 0),
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def stream_events(body: dict[str, Any]) -> Iterator[bytes]:
    """A whole Responses object as its event stream (spec-complete, in one go)."""
    seq = 0

    def ev(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    yield ev("response.created", response={**body, "status": "in_progress", "output": []})
    for index, item in enumerate(body["output"]):
        # added as the upstream adds it: in progress, its text and arguments to come in
        # the events after it (SDKs add those to the added item: given whole here, the
        # openai SDK's snapshot held the text twice)
        yield ev("response.output_item.added", output_index=index, item=_begun(item))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield ev("response.content_part.added", item_id=item["id"], output_index=index,
                     content_index=0, part={"type": "output_text", "text": "",
                                            "annotations": []})
            yield ev("response.output_text.delta", item_id=item["id"], output_index=index,
                     content_index=0, delta=text)
            yield ev("response.output_text.done", item_id=item["id"], output_index=index,
                     content_index=0, text=text)
            yield ev("response.content_part.done", item_id=item["id"], output_index=index,
                     content_index=0, part=item["content"][0])
        elif item["type"] == "function_call":
            yield ev("response.function_call_arguments.delta", item_id=item["id"],
                     output_index=index, delta=item["arguments"])
            yield ev("response.function_call_arguments.done", item_id=item["id"],
                     output_index=index, arguments=item["arguments"])
        yield ev("response.output_item.done", output_index=index, item=item)
    yield ev(f"response.{body['status']}", response=body)


def _begun(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as its ``output_item.added`` event carries it."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item


def replay(reply: Message, stream: bool, headers: dict[str, str]) -> Response:
    headers = {**headers, REPLAYED_HEADER: "true"}
    body = response_object(reply)
    if stream:
        return StreamingResponse(stream_events(body), headers=headers,
                                 media_type="text/event-stream")
    return JSONResponse(body, headers=headers)


RESPONSES_WIRE = Wire("responses", RESPONSES.path, request_messages, openai_error, _fields,
                      replay, decoder=ResponsesStream, holds=_holds, named=True,
                      rewrite=complete_events, expand=expand_previous,
                      failures=ResponsesEvents)
