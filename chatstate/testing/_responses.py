"""The fake model's OpenAI Responses side (``POST /v1/responses``): requests read into
chat messages, replies written as Responses objects and as its SSE event stream.

The reply itself is the chat fake's (``_replies``): a request is translated into
the chat-completions message list it means, answered the same way, and the
answer is written in the Responses shapes, so one conversation gets one reply
whatever API asked. A request that asks for reasoning (``reasoning``, or
``include: ["reasoning.encrypted_content"]``) gets a reasoning item first; its
``encrypted_content`` is signed, and a request that sends back a reasoning item
whose content was changed is refused (400), as the real API refuses it.
``previous_response_id`` is refused (400) as stateless servers (llama.cpp) do.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from chatstate.testing._replies import error_body

__all__ = ["events", "request_messages", "response_body"]


def sign(text: str) -> str:
    """The fake's signature of ``text`` (what a reasoning item or thinking block carries)."""
    return base64.b64encode(hashlib.sha256(b"chatstate-fake:" + text.encode()).digest()
                            ).decode()


def encrypt(summary: str) -> str:
    return base64.b64encode(summary.encode()).decode() + "." + sign(summary)


def _valid_encrypted(value: str) -> bool:
    payload, _, signature = value.partition(".")
    try:
        text = base64.b64decode(payload, validate=True).decode()
    except ValueError:
        return False
    return signature == sign(text)


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "input_image":
        url = part.get("image_url")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_file":
        inner = {k: part[k] for k in ("file_data", "filename", "file_id") if k in part}
        return {"type": "file", "file": inner}
    return dict(part)


def _content(content: object) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts = [_part(p) for p in content if isinstance(p, Mapping)] \
        if isinstance(content, list) else []
    if all(p.get("type") == "text" for p in parts):
        return "".join(str(p["text"]) for p in parts)
    return parts


def request_messages(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """(the chat messages a Responses request means, an error text if it is refused)."""
    if body.get("previous_response_id"):
        return [], "previous_response_id is not supported by this server (fake)"
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return [], "input must be a string or a list of items (fake)"
    for item in items:
        if not isinstance(item, Mapping):
            return [], "input items must be objects (fake)"
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role"))
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id")), "type": "function",
                    "function": {"name": str(item.get("name")),
                                 "arguments": str(item.get("arguments", ""))}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")),
                             "content": output if isinstance(output, str)
                             else _content(output)})
        elif kind == "reasoning":
            encrypted = item.get("encrypted_content")
            if isinstance(encrypted, str) and not _valid_encrypted(encrypted):
                return [], "The encrypted content for item rs could not be verified (fake)."
        # other item kinds (hosted tools, web search) carry nothing the fake answers
    return messages, None


def offered(body: Mapping[str, Any]) -> list[str]:
    tools = body.get("tools")
    return [str(t["name"]) for t in tools if isinstance(t, Mapping) and
            t.get("type") == "function" and "name" in t] if isinstance(tools, list) else []


def wants_reasoning(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(give a reasoning item, with encrypted_content)."""
    include = body.get("include") or []
    encrypted = "reasoning.encrypted_content" in include
    return bool(body.get("reasoning")) or encrypted, encrypted


class Output:
    """One reply's Responses output items, built once for the body and the stream."""

    def __init__(self, rid: str, reply: Any, body: Mapping[str, Any], thought: str,
                 cut_status: str = "incomplete") -> None:
        self.rid, self.reply, self.body, self.cut_status = rid, reply, body, cut_status
        reasoning, encrypted = wants_reasoning(body)
        self.items: list[dict[str, Any]] = []
        n = rid.rsplit("-", 1)[-1]
        if reasoning:
            item: dict[str, Any] = {"type": "reasoning", "id": f"rs_fake_{n}",
                                    "summary": [{"type": "summary_text", "text": thought}]}
            if encrypted:
                item["encrypted_content"] = encrypt(thought)
            self.items.append(item)
        text = "".join(reply.chunks)
        if text or not reply.calls:
            self.items.append({"type": "message", "id": f"msg_fake_{n}", "status": "completed",
                               "role": "assistant", "content": [
                                   {"type": "output_text", "text": text, "annotations": [],
                                    "logprobs": []}]})
        for i, call in enumerate(reply.calls):
            self.items.append({"type": "function_call", "id": f"fc_fake_{n}_{i}",
                               "call_id": call["id"], "name": call["function"]["name"],
                               "arguments": call["function"]["arguments"],
                               "status": "completed"})

    @property
    def cut(self) -> bool:
        return bool(self.reply.finish == "length")

    def usage(self) -> dict[str, Any]:
        u = self.reply.usage
        return {"input_tokens": u["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": u["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u["total_tokens"]}

    def response(self, status: str, output: list[dict[str, Any]] | None = None,
                 usage: bool = True) -> dict[str, Any]:
        body = self.body
        return {
            "id": self.rid, "object": "response", "created_at": self.reply.created,
            "status": status, "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.reply.model, "output": self.items if output is None else output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None, "reasoning": body.get("reasoning") or
            {"effort": None, "summary": None},
            "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": body.get("top_p", 1.0),
            "truncation": "disabled", "usage": self.usage() if usage else None,
            "user": None, "metadata": body.get("metadata") or {},
        }


def response_body(out: Output) -> dict[str, Any]:
    return out.response(out.cut_status if out.cut else "completed")


def events(out: Output, arg_chunk: int) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(event type, payload, whether it carries reply text) for the whole stream.

    Each payload has ``type`` and ``sequence_number``; every item event has its
    ``output_index`` (and ``content_index`` where the spec has one)."""
    seq = 0

    def ev(kind: str, text: bool = False, **fields: Any) -> tuple[str, dict[str, Any], bool]:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return kind, payload, text

    yield ev("response.created", response=out.response("in_progress", [], usage=False))
    yield ev("response.in_progress", response=out.response("in_progress", [], usage=False))
    for index, item in enumerate(out.items):
        kind, iid = item["type"], item["id"]
        if kind == "reasoning":
            yield ev("response.output_item.added", output_index=index,
                     item={**item, "summary": []})
            for si, part in enumerate(item["summary"]):
                yield ev("response.reasoning_summary_part.added", item_id=iid,
                         output_index=index, summary_index=si,
                         part={"type": "summary_text", "text": ""})
                yield ev("response.reasoning_summary_text.delta", item_id=iid,
                         output_index=index, summary_index=si, delta=part["text"])
                yield ev("response.reasoning_summary_text.done", item_id=iid,
                         output_index=index, summary_index=si, text=part["text"])
                yield ev("response.reasoning_summary_part.done", item_id=iid,
                         output_index=index, summary_index=si, part=part)
        elif kind == "message":
            yield ev("response.output_item.added", output_index=index,
                     item={**item, "status": "in_progress", "content": []})
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield ev("response.content_part.added", item_id=iid, output_index=index,
                     content_index=0, part=empty)
            for piece in out.reply.chunks:
                yield ev("response.output_text.delta", True, item_id=iid, output_index=index,
                         content_index=0, delta=piece, logprobs=[])
            text = item["content"][0]["text"]
            yield ev("response.output_text.done", item_id=iid, output_index=index,
                     content_index=0, text=text, logprobs=[])
            yield ev("response.content_part.done", item_id=iid, output_index=index,
                     content_index=0, part=item["content"][0])
        else:
            yield ev("response.output_item.added", output_index=index,
                     item={**item, "arguments": "", "status": "in_progress"})
            arguments = item["arguments"]
            step = arg_chunk if arg_chunk > 0 else max(len(arguments), 1)
            for at in range(0, len(arguments), step):
                yield ev("response.function_call_arguments.delta", item_id=iid,
                         output_index=index, delta=arguments[at:at + step])
            yield ev("response.function_call_arguments.done", item_id=iid, output_index=index,
                     name=item["name"], arguments=arguments)
        yield ev("response.output_item.done", output_index=index, item=item)
    final = response_body(out)
    yield ev(f"response.{final['status']}", response=final)


def stream_error(status: int, message: str) -> dict[str, Any]:
    """The ``error`` event a Responses stream ends with when the server fails mid-stream."""
    error = error_body(status, message)["error"]
    return {"type": "error", "code": error["type"], "message": message, "param": None,
            "sequence_number": 0}

