"""The OpenAI Responses dialect (``POST /responses``): input items in, output items out.

The stored form stays chat completions, so a request is built from it: system
and user messages become message items (parts as ``input_text``,
``input_image``, ``input_file``), an assistant message becomes its reasoning
items (kept from an earlier Responses reply, sent back unchanged: their
``encrypted_content`` included), an output message and one ``function_call``
per tool call, and a ``tool`` message a ``function_call_output`` by
``call_id``. Chat parameters are renamed (``max_tokens`` ->
``max_output_tokens``, chat-shaped ``tools``/``tool_choice`` flattened); the
rest go as they are (``include``, ``reasoning``, ``store``).

A reply's ``status`` is the stored finish_reason: ``completed`` is "stop" (or
"tool_calls"), ``incomplete`` for ``max_output_tokens`` is "length" (a cut
reply), for ``content_filter`` "content_filter"; ``failed`` and ``error``
events fail the attempt. ``settle`` reads a ``completed`` reply whose output tokens
reached the requested ``max_output_tokens`` as "length" too: llama.cpp never says
``incomplete``. Reasoning items are kept in ``extra["reasoning_items"]``.
Chatstate asks for nothing by itself: no ``previous_response_id`` (the
adapter is stateless and sends the whole conversation every time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chatstate.adapter._policy import AttemptFailed
from chatstate.adapter.dialects.base import (
    AllEventsBut,
    ErrorDetails,
    Reply,
    Usage,
    bearer,
    joined,
    note_dropped,
    request_messages,
)
from chatstate.adapter.dialects.chat_completions import context_overflow, provider_message

__all__ = ["RESPONSES", "Responses", "ResponsesStream", "encode_input", "parse_response"]

_CHAT_ONLY = ("stream_options", "n", "logprobs", "top_logprobs", "stop", "seed",
              "frequency_penalty", "presence_penalty", "logit_bias", "response_format",
              "max_tokens", "max_completion_tokens", "reasoning_effort")
_RETRYABLE_CODES = ("server_error", "rate_limit_exceeded", "overloaded", "overloaded_error")


def _malformed(detail: str) -> AttemptFailed:
    return AttemptFailed("malformed", f"malformed reply: {detail}")


def _input_part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "input_text", "text": str(part.get("text", ""))}
    if kind == "image_url":
        inner = part.get("image_url") or {}
        out: dict[str, Any] = {"type": "input_image", "image_url": inner.get("url")}
        if inner.get("detail"):
            out["detail"] = inner["detail"]
        return out
    if kind == "file":
        inner = part.get("file") or {}
        return {"type": "input_file", **{k: inner[k] for k in ("file_data", "filename",
                                                                "file_id") if k in inner}}
    return dict(part)  # a kind chatstate does not know: as it came


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def encode_input(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                  dict[str, int]]:
    """(the input items for the stored messages, what of them was left out, by kind)."""
    items: list[dict[str, Any]] = []
    dropped = {"thinking_blocks": 0}
    for message, fields in request_messages(messages):
        role, content = message.get("role"), message.get("content")
        dropped["thinking_blocks"] += len(fields.get("thinking_blocks") or ())
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id"),
                          "output": content if isinstance(content, str) else _text(content)})
            continue
        if role == "assistant":
            items.extend(dict(i) for i in fields.get("reasoning_items") or ()
                         if isinstance(i, Mapping))
            text = _text(content)
            if text:
                items.append({"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": text, "annotations": []}]})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                items.append({"type": "function_call", "call_id": call.get("id"),
                              "name": function.get("name"),
                              "arguments": function.get("arguments", "")})
            continue
        items.append({"type": "message", "role": role, "content": content
                      if isinstance(content, str) else [
                          _input_part(p) for p in content or () if isinstance(p, Mapping)]})
    return items, dropped


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-shaped function tool, flattened as Responses wants it; others as they are."""
    function = tool.get("function")
    if tool.get("type") == "function" and isinstance(function, Mapping):
        return {"type": "function", **dict(function)}
    return dict(tool)


def _tool_choice(choice: object) -> object:
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def encode_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    given = dict(params or {})
    body = {k: v for k, v in given.items() if k not in _CHAT_ONLY}
    limit = given.get("max_completion_tokens", given.get("max_tokens"))
    if limit is not None and "max_output_tokens" not in body:
        body["max_output_tokens"] = limit
    if given.get("reasoning_effort") and "reasoning" not in body:
        body["reasoning"] = {"effort": given["reasoning_effort"]}
    if isinstance(body.get("tools"), list):
        body["tools"] = [_tool(t) for t in body["tools"] if isinstance(t, Mapping)]
    if "tool_choice" in body:
        body["tool_choice"] = _tool_choice(body["tool_choice"])
    return body


def parse_usage(value: object) -> Usage | None:
    """Responses token counts in the stored (chat-completions) names."""
    if not isinstance(value, Mapping):
        return None
    out: Usage = {}
    for ours, theirs in (("prompt_tokens", "input_tokens"),
                         ("completion_tokens", "output_tokens"), ("total_tokens", "total_tokens")):
        v = value.get(theirs)
        if isinstance(v, int) and not isinstance(v, bool):
            out[ours] = v
    for ours, theirs, key, inner in (
            ("prompt_tokens_details", "input_tokens_details", "cached_tokens", "cached_tokens"),
            ("completion_tokens_details", "output_tokens_details", "reasoning_tokens",
             "reasoning_tokens")):
        detail = value.get(theirs)
        if isinstance(detail, Mapping) and isinstance(detail.get(inner), int):
            out[ours] = {key: detail[inner]}
    return out or None


def _finish(response: Mapping[str, Any], has_calls: bool) -> str:
    status = response.get("status")
    if status == "failed":
        error = response.get("error") if isinstance(response.get("error"), Mapping) else {}
        assert isinstance(error, Mapping)
        raise AttemptFailed("provider", "the provider reported that the response failed",
                            provider_message=str(error.get("message") or "response failed"),
                            retryable=error.get("code") in _RETRYABLE_CODES)
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


def _fold(output: object) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(text, tool calls, extra) of a response's output items."""
    if not isinstance(output, list):
        raise _malformed("the response has no output list")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[dict[str, Any]] = []
    refusals: list[str] = []
    for item in output:
        if not isinstance(item, Mapping):
            raise _malformed("an output item is not an object")
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    texts.append(str(part.get("text", "")))
                elif isinstance(part, Mapping) and part.get("type") == "refusal":
                    refusals.append(str(part.get("refusal", "")))
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            arguments = item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or \
                    not isinstance(arguments, str):
                raise _malformed("a function_call item has no call_id, name or arguments")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": arguments}})
        elif kind == "reasoning":
            reasoning.append(dict(item))
    extra: dict[str, Any] = {}
    if reasoning:
        extra["reasoning_items"] = reasoning
    if refusals:
        extra["refusal"] = "".join(refusals)
    return "".join(texts), calls, extra


def parse_response(data: object) -> Reply:
    """A non-streamed Responses object -> Reply; AttemptFailed if misshapen or failed."""
    if not isinstance(data, Mapping):
        raise _malformed("expected a JSON object")
    text, calls, extra = _fold(data.get("output"))
    if isinstance(data.get("id"), str):
        extra["response_id"] = data["id"]
    finish = _finish(data, bool(calls))
    model = data.get("model")
    return Reply(text, model if isinstance(model, str) else None, parse_usage(data.get("usage")),
                 finish, calls or None, extra or None)


class ResponsesStream:
    """Folds Responses stream events: text from ``output_text.delta``, items as they finish,
    the finish from ``response.completed`` / ``response.incomplete``."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._items: dict[str, dict[str, Any]] = {}  # by item id (or position), in order
        self.model: str | None = None
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self._final: Mapping[str, Any] | None = None

    @property
    def text(self) -> str:
        return joined(self._parts)

    def _key(self, event: Mapping[str, Any]) -> str:
        key = event.get("item_id") or (event.get("item") or {}).get("id")
        if isinstance(key, str) and key:
            return key
        index = event.get("output_index")
        return f"#{index}" if isinstance(index, int) else f"#{len(self._items)}"

    def feed(self, event: object) -> str:
        if not isinstance(event, Mapping):
            raise _malformed("stream event is not a JSON object")
        kind = event.get("type")
        if kind == "error":
            code = event.get("code")
            raise AttemptFailed("provider", "the provider reported an error mid-stream",
                                provider_message=str(event.get("message") or code or "error"),
                                retryable=code in _RETRYABLE_CODES)
        if kind in ("response.created", "response.in_progress"):
            response = event.get("response")
            if isinstance(response, Mapping) and isinstance(response.get("model"), str):
                self.model = response["model"]
            return ""
        if kind == "response.output_text.delta":
            delta = event.get("delta")
            if not isinstance(delta, str):
                raise _malformed("output_text.delta has no text delta")
            self._parts.append(delta)
            return delta
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if not isinstance(item, Mapping):
                raise _malformed(f"{kind} has no item")
            self._items[self._key(event)] = dict(item)
        elif kind == "response.function_call_arguments.delta":
            item = self._items.setdefault(self._key(event), {"type": "function_call"})
            item["arguments"] = str(item.get("arguments", "")) + str(event.get("delta", ""))
        elif kind == "response.function_call_arguments.done":
            item = self._items.setdefault(self._key(event), {"type": "function_call"})
            if isinstance(event.get("arguments"), str):
                item["arguments"] = event["arguments"]
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            if not isinstance(response, Mapping):
                raise _malformed(f"{kind} has no response")
            self._final = response
            self.model = response.get("model") if isinstance(response.get("model"), str) \
                else self.model
            self.usage = parse_usage(response.get("usage")) or self.usage
            output = response.get("output")
            _, calls, _ = _fold(output if isinstance(output, list) and output
                                else list(self._items.values()))
            self.finish_reason = _finish(response, bool(calls))
        return ""

    def reply(self) -> Reply:
        final = self._final or {}
        output = final.get("output")
        items = output if isinstance(output, list) and output else list(self._items.values())
        _, calls, extra = _fold(items)
        if isinstance(final.get("id"), str):
            extra["response_id"] = final["id"]
        return Reply(self.text, self.model, self.usage, self.finish_reason, calls or None,
                     extra or None)


class Responses:
    """The OpenAI Responses API (also llama.cpp's and vLLM's ``/v1/responses``)."""

    name = "responses"
    path = "/responses"
    sse_events = AllEventsBut({"ping", "keepalive"})
    sse_done = "[DONE]"  # OpenAI sends none; a proxy that adds one is not an event

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def encode(self, messages: Sequence[Mapping[str, Any]], *, model: str,
               params: Mapping[str, Any] | None, stream: bool) -> dict[str, Any]:
        body = encode_params(params)
        items, dropped = encode_input(messages)
        note_dropped(self.name, dropped)
        body["model"] = model
        body["input"] = items
        if stream:
            body["stream"] = True
        else:
            body.pop("stream", None)
        return body

    def decode(self, data: object) -> Reply:
        return parse_response(data)

    def stream_decoder(self) -> ResponsesStream:
        return ResponsesStream()

    def settle(self, reply: Reply, body: Mapping[str, Any]) -> Reply:
        """llama.cpp reports a reply cut by ``max_output_tokens`` as ``completed``: a
        finished reply whose output tokens reached the requested limit is read as cut. (A
        reply that ends naturally on exactly the limit is then marked cut too; continuing
        it costs a turn, losing a cut would cost the reader the rest.)"""
        limit = body.get("max_output_tokens")
        used = (reply.usage or {}).get("completion_tokens")
        if reply.finish_reason == "stop" and isinstance(limit, int) \
                and isinstance(used, int) and used >= limit > 0:
            return reply._replace(finish_reason="length")
        return reply

    def error_details(self, body: object) -> ErrorDetails:
        return ErrorDetails(provider_message(body), context_overflow(body))

    def headers(self, api_key: str | None) -> dict[str, str]:
        return bearer(api_key)


RESPONSES = Responses()
