"""The fake model's HTTP side: routing, the OpenAI wire format, and each fault acted out.

HTTP/1.1 with keep-alive and chunked SSE, like a real provider, so a
"cut" is a genuine mid-body connection drop that the client's HTTP stack
sees, not a polite end of stream.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

from chatstate.testing import _messages, _responses
from chatstate.testing._extras import (
    HTML_PAGE,
    embeddings_body,
    model_body,
    text_completion_body,
    text_completion_chunks,
)
from chatstate.testing._parts import received_parts
from chatstate.testing._replies import (
    CHUNK_BOUNDARY,
    call_deltas,
    chunk_body,
    completion_body,
    default_error_message,
    error_body,
    prompt_tokens,
    reply_chunks,
    tool_reply,
    usage,
)
from chatstate.testing._script import Fault, Script


class FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() drops connections itself; never wait on a hung handler
    request_queue_size = 512  # a load test opens hundreds of streams at once

    def __init__(self, address: tuple[str, int], script: Script) -> None:
        self.script = script
        self.stopping = threading.Event()
        self.ids = itertools.count(1)
        self.request_ids = itertools.count(1)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, conn: socket.socket, *, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def stop(self) -> None:
        self.stopping.set()  # wakes handlers sleeping in latency/hang/chunk_delay
        self.shutdown()
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:  # idle keep-alive handlers would otherwise block on read
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-reply (a timeout under test) is not a server bug.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each response waits
    # ~40 ms for a delayed ACK, which would make the fake slower than any real server.
    disable_nagle_algorithm = True
    server: FakeHTTPServer
    request_id: str | None = None  # the chat request being answered (keep-alive: reset)

    def parse_request(self) -> bool:
        self.request_id = None
        return super().parse_request()

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open_=True)

    def finish(self) -> None:
        self.server.track(self.connection, open_=False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the request log is the record, and stderr belongs to the test runner."""

    # -- routing ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        script = self.server.script
        if self.path == "/v1/models":
            script.record(self._entry(None, status=200, behaviour="ok"))
            model = script.options.model
            self._json(200, {"object": "list", "data": [
                {"id": model, "object": "model", "created": 0, "owned_by": "chatstate"}]})
        elif self.path.startswith("/v1/models/"):
            model_id = self.path.removeprefix("/v1/models/")
            known = model_id == script.options.model
            script.record(self._entry(None, status=200 if known else 404, behaviour="ok"))
            if known:
                self._json(200, model_body(model_id))
            else:
                self._json(404, error_body(404, f"The model '{model_id}' does not exist"))
        elif self.path == "/_fake/log":
            self._json(200, script.apply("log", {}))
        elif self.path == "/_fake/state":
            self._json(200, script.apply("state", {}))
        else:
            self._json(404, error_body(404, f"no route GET {self.path} (fake)"))

    def do_HEAD(self) -> None:  # Claude Code probes HEAD / before its first request
        self._send_head(200, "text/plain", 0)

    def do_POST(self) -> None:
        body = self._read_json()
        if body is None:
            return
        path = self.path.split("?", 1)[0]
        if path == "/v1/chat/completions":
            self._chat(body)
        elif path in ("/v1/embeddings", "/v1/completions"):
            self._other(path, body)
        elif path == "/v1/responses":
            self._dialect(body, "responses")
        elif path == "/v1/messages":
            self._dialect(body, "messages")
        elif path == "/v1/messages/count_tokens":
            self._count_tokens(body)
        elif self.path == "/_fake/control":
            self._control(body)
        elif self.path == "/_fake/reset":
            self.server.script.apply("reset", {})
            self._json(200, {"ok": True, "result": None})
        else:
            self._json(404, error_body(404, f"no route POST {self.path} (fake)"))

    def _control(self, body: dict[str, Any]) -> None:
        try:
            result = self.server.script.apply(str(body.get("command")), dict(body.get("args", {})))
        except (TypeError, ValueError) as exc:
            self._json(400, error_body(400, f"bad control command: {exc}"))
            return
        self._json(200, {"ok": True, "result": result})

    def _count_tokens(self, body: dict[str, Any]) -> None:
        """Anthropic's token count: the words of the system prompt and the messages' text."""
        self.server.script.record(self._entry(body, status=200, behaviour="ok"))
        texts = [body.get("system")] + [m.get("content") for m in body.get("messages") or ()
                                        if isinstance(m, dict)]
        words = 0
        for text in texts:
            if isinstance(text, list):
                text = " ".join(str(b.get("text", "")) for b in text if isinstance(b, dict))
            words += len(str(text or "").split())
        self._json(200, {"input_tokens": words})

    def _other(self, path: str, body: dict[str, Any]) -> None:
        """Embeddings and legacy completions: deterministic answers, logged, no faults."""
        script = self.server.script
        script.record(self._entry(body, status=200, behaviour="ok"))
        model = script.options.model
        cid, created = f"cmpl-fake-{next(self.server.ids)}", int(time.time())
        if path == "/v1/embeddings":
            self._json(200, embeddings_body(body, model))
        elif body.get("stream"):
            self._send_head(200, "text/event-stream; charset=utf-8", None)
            for piece in text_completion_chunks(body, model, cid, created):
                self._event(piece)
            self._event_raw("[DONE]")
            self._end_chunks()
        else:
            self._json(200, text_completion_body(body, model, cid, created))

    # -- the chat endpoint ---------------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        # every chat answer names its request, as OpenAI's ``x-request-id`` does, and
        # carries the scripted ``reply_headers`` (rate-limit headers, say)
        self.request_id = f"req_fake_{next(self.server.request_ids)}"
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            self._json(400, error_body(400, "messages must be a list of objects (fake)"))
            return
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        self._answer(body, messages, _offered(body), max_tokens, "chat")

    def _dialect(self, body: dict[str, Any], wire: str) -> None:
        """A Responses or Anthropic request: read into chat messages, answered as chat is."""
        module = _responses if wire == "responses" else _messages
        messages, refused = module.request_messages(body)
        if refused is not None:
            self.server.script.record(self._entry(body, status=400, behaviour="refused",
                                                  messages=messages))
            self._wire_error(wire, 400, refused)
            return
        max_tokens = body.get("max_output_tokens" if wire == "responses" else "max_tokens")
        self._answer(body, messages, module.offered(body), max_tokens, wire)

    def _wire_error(self, wire: str, status: int, message: str,
                    headers: dict[str, str] | None = None) -> None:
        payload = _messages.error_body(status, message) if wire == "messages" else \
            error_body(status, message)
        self._raw(status, json.dumps(payload).encode(), "application/json", headers)

    def _answer(self, body: dict[str, Any], messages: list[dict[str, Any]],
                offered: list[str], max_tokens: object, wire: str) -> None:
        if self.server.script.options.strict_roles and not _alternate(messages):
            self.server.script.record(self._entry(body, status=400, behaviour="strict",
                                                  messages=messages))
            self._wire_error(wire, 400, STRICT_ROLES_ERROR)
            return
        refusal = (_non_text_refusal(messages) if self.server.script.options.text_only
                   else None)
        if refusal is not None:
            self.server.script.record(self._entry(body, status=refusal[0],
                                                  behaviour="text_only", messages=messages))
            self._wire_error(wire, refusal[0], refusal[1])
            return
        last_user = next((str(m.get("content")) for m in reversed(messages)
                          if m.get("role") == "user"), "")
        if self._over_window(body, messages, wire):
            return
        act = self.server.script.next_behaviour(last_user)
        failing = act is not None and act.kind in ("fail", "rule")
        self.server.script.record(self._entry(
            body, status=act.status if act and failing else 200,
            behaviour=act.kind if act else "ok", messages=messages))
        self._pause(self.server.script.options.latency)
        if act is not None and failing:
            self._error(act.status, act.retry_after, act.message, wire)
            return
        if act is not None and act.kind == "hang":
            self._pause(act.seconds)
        if act is not None and act.kind == "html":
            self._raw(200, HTML_PAGE, "text/html; charset=utf-8")
            return
        reply = self._reply(body, messages, offered,
                            max_tokens if isinstance(max_tokens, int) else None)
        if wire != "chat":
            self._answer_dialect(body, messages, reply, act, wire)
        elif body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(reply, act, include)
        else:
            self._complete(reply, act)

    def _answer_dialect(self, body: dict[str, Any], messages: list[dict[str, Any]],
                        reply: _Reply, act: Fault | None, wire: str) -> None:
        last_user = next((m.get("content") for m in reversed(messages)
                          if m.get("role") == "user"), "")
        thought = f"The user wrote {len(str(last_user).split())} words; I answer with an echo."
        n = reply.id.rsplit("-", 1)[-1]
        out: _responses.Output | _messages.Output
        if wire == "responses":
            out = _responses.Output(f"resp_fake-{n}", reply, body, thought,
                                    self.server.script.options.responses_cut_status)
            whole = _responses.response_body(out)
            stream = _responses.events(out, self.server.script.options.arg_chunk)
        else:
            out = _messages.Output(f"msg_fake-{n}", reply, body, thought)
            whole = _messages.message_body(out)
            stream = _messages.events(out, self.server.script.options.arg_chunk)
        if not body.get("stream"):
            if act is not None and act.kind == "malformed":
                self._raw(200, b'{"output": [', "application/json")
                return
            raw = self._dumps(whole).encode()
            if act is not None and act.kind == "cut":
                self._send_head(200, "application/json", len(raw))
                self.wfile.write(raw[: len(raw) // 2])
                self.close_connection = True
                return
            self._raw(200, raw, "application/json")
            return
        self._send_head(200, "text/event-stream; charset=utf-8", None)
        texts = 0
        for index, (name, payload, text) in enumerate(stream):
            if act is not None and act.kind == "error_event" and text and \
                    texts >= act.after_chunks:
                message = _event_message(act)
                error = _messages.error_body(act.status, message) if wire == "messages" \
                    else _responses.stream_error(act.status, message)
                self._named_event("error", self._dumps(error))
                self._pause(act.seconds)
                self._end_chunks()
                return
            if act is not None and act.kind == "error_event" and text:
                texts += 1
            if act is not None and act.kind == "cut" and text:
                if texts >= act.after_chunks:
                    if act.clean:
                        self._end_chunks()
                    else:
                        self.close_connection = True
                    return
                texts += 1
            self._named_event(name, self._dumps(payload))
            if index == 0 and act is not None and act.kind == "malformed":
                self._named_event(name, "{this is not json")
            if text:
                self._pause(self.server.script.options.chunk_delay)
        self._end_chunks()

    def _over_window(self, body: dict[str, Any], messages: list[dict[str, Any]],
                     wire: str = "chat") -> bool:
        """Answer 400 as OpenAI (or llama.cpp, or Anthropic) does when the prompt is past
        the window."""
        options = self.server.script.options
        window = options.context_window
        tokens = math.ceil(prompt_tokens(messages) * options.token_scale)
        if window is None or tokens <= window:
            return False
        self.server.script.record(self._entry(body, status=400, behaviour="context",
                                              messages=messages))
        if wire == "messages":
            self._wire_error(wire, 400, f"prompt is too long: {tokens} tokens > {window} "
                                        "maximum")
            return True
        if options.overflow_style == "llama":
            self._json(400, {"error": {
                "code": 400, "type": "exceed_context_size_error",
                "message": f"request ({tokens} tokens) exceeds the available context size "
                           f"({window} tokens), try increasing it",
                "n_prompt_tokens": tokens, "n_ctx": window}})
            return True
        self._json(400, {"error": {
            "message": f"This model's maximum context length is {window} tokens. However, "
                       f"your messages resulted in {tokens} tokens. Please reduce the length "
                       "of the messages.",
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}})
        return True

    def _reply(self, body: dict[str, Any], messages: list[dict[str, Any]],
               offered: list[str], max_tokens: int | None) -> _Reply:
        script = self.server.script
        options = script.options
        with script.lock:
            scripted = tool_reply(messages, list(script.tool_rules), offered)
        calls: list[dict[str, Any]] = []
        if scripted is not None:
            text, calls = scripted
            chunks = [c for c in CHUNK_BOUNDARY.split(text) if c]
            finish = "tool_calls" if calls else "stop"
        else:
            chunks, finish = reply_chunks(messages, options.reply_words, max_tokens)
        return _Reply(f"chatcmpl-fake-{next(self.server.ids)}",
                      str(body.get("model") or options.model), int(time.time()),
                      chunks, finish, usage(messages, chunks), calls)

    def _complete(self, reply: _Reply, fault: Fault | None) -> None:
        if fault is not None and fault.kind == "malformed":
            self._raw(200, b'{"choices": [{"message": ', "application/json")
            return
        raw = self._dumps(completion_body(reply.id, reply.model, reply.created, "".join(
            reply.chunks), reply.finish, reply.usage, reply.calls)).encode()
        if fault is not None and fault.kind == "cut":
            self._send_head(200, "application/json", len(raw))
            self.wfile.write(raw[: len(raw) // 2])
            self.close_connection = True  # the rest never comes
            return
        self._raw(200, raw, "application/json")

    def _stream(self, reply: _Reply, fault: Fault | None, include_usage: bool) -> None:
        self._send_head(200, "text/event-stream; charset=utf-8", None)

        def chunk(**kwargs: Any) -> dict[str, Any]:
            return chunk_body(reply.id, reply.model, reply.created,
                              include_usage=include_usage, **kwargs)

        self._event(chunk(delta={"role": "assistant", "content": "", "refusal": None}))
        if fault is not None and fault.kind == "malformed":
            self._event_raw("{this is not json")
        deltas = [{"content": piece} for piece in reply.chunks]
        deltas += call_deltas(reply.calls, self.server.script.options.arg_chunk)
        for index, delta in enumerate(deltas):
            if fault is not None and fault.kind in ("cut", "error_event") \
                    and index >= fault.after_chunks:
                break
            self._event(chunk(delta=delta))
        else:
            self._event(chunk(delta={}, finish_reason=reply.finish))
            if include_usage:
                self._event(chunk_body(reply.id, reply.model, reply.created,
                                       include_usage=True, token_usage=reply.usage))
            self._event_raw("[DONE]")
            self._end_chunks()
            return
        assert fault is not None
        if fault.kind == "error_event":  # a provider failing mid-generation says so in-band
            self._event_raw(self._dumps(error_body(fault.status, _event_message(fault))))
            self._pause(fault.seconds)
            self._end_chunks()
        elif fault.clean:  # a well-formed body that simply stops: no finish_reason, no [DONE]
            self._end_chunks()
        else:  # drop the connection mid-body, as a dying proxy or network would
            self.close_connection = True

    # -- writing ---------------------------------------------------------------------------

    def _error(self, status: int, retry_after: float | str | None, message: str | None,
               wire: str = "chat") -> None:
        headers = {}
        if retry_after is not None:
            headers["Retry-After"] = _header_seconds(retry_after)
        self._wire_error(wire, status, message or default_error_message(status), headers)

    def _json(self, status: int, payload: Any) -> None:
        self._raw(status, json.dumps(payload).encode(), "application/json")

    def _raw(self, status: int, raw: bytes, content_type: str,
             headers: dict[str, str] | None = None) -> None:
        self._send_head(status, content_type, len(raw), headers)
        self.wfile.write(raw)

    def _send_head(self, status: int, content_type: str, length: int | None,
                   headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
        else:
            self.send_header("Content-Length", str(length))
        answer = dict(headers or {})
        if self.request_id is not None:
            answer = {"x-request-id": self.request_id,
                      **self.server.script.options.reply_headers, **answer}
        for name, value in answer.items():
            self.send_header(name, value)
        self.end_headers()

    def _dumps(self, payload: Any) -> str:
        """A reply or an event's data as this fake's JSON (``ascii_json``)."""
        return json.dumps(payload, ensure_ascii=self.server.script.options.ascii_json)

    def _event(self, payload: dict[str, Any]) -> None:
        self._event_raw(self._dumps(payload))
        self._pause(self.server.script.options.chunk_delay)

    def _event_raw(self, data: str) -> None:
        raw = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))

    def _named_event(self, name: str, data: str) -> None:
        raw = f"event: {name}\ndata: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    # -- reading -----------------------------------------------------------------------------

    def _read_json(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._json(400, error_body(400, "request body must be a JSON object (fake)"))
            return None
        return body

    def _entry(self, body: dict[str, Any] | None, *, status: int,
               behaviour: str, messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """``messages`` are the chat messages the request meant (a Responses or Anthropic
        request's translated; ``body`` keeps what it sent)."""
        body = body or {}
        if messages is None:
            messages = body.get("messages")
        return {
            "time": time.time(), "method": self.command, "path": self.path,
            "body": body or None, "messages": messages, "model": body.get("model"),
            "parts": received_parts(messages or []),
            "stream": bool(body.get("stream")),
            # Presence only: the value is a credential and must never be recorded. The
            # fingerprint (12 hex of its sha256) lets a test tell which key arrived.
            "authorization": "Authorization" in self.headers or "x-api-key" in self.headers,
            "authorization_fingerprint": fingerprint(self.headers.get("Authorization")
                                                     or self.headers.get("x-api-key")),
            "status": status, "behaviour": behaviour,
            "request_id": self.request_id,
            # every other header, names lower-cased: credentials never
            "headers": {k.lower(): v for k, v in self.headers.items()
                        if k.lower() not in SECRET_HEADERS},
        }

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            self.server.stopping.wait(seconds)


SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key",
                            "api-key"})
"""Request headers the log never records (only whether ``Authorization`` came)."""


def fingerprint(value: str | None) -> str | None:
    """A short, one-way tag of a header value: enough to compare, useless to replay."""
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()[:12]


class _Reply(NamedTuple):
    id: str
    model: str
    created: int
    chunks: list[str]
    finish: str
    usage: dict[str, int]
    calls: list[dict[str, Any]]


def _offered(body: dict[str, Any]) -> list[str]:
    """The names of the tools a request offers."""
    tools = body.get("tools")
    return [str(t["function"]["name"]) for t in tools if isinstance(t, dict) and
            isinstance(t.get("function"), dict) and "name" in t["function"]] \
        if isinstance(tools, list) else []


def _header_seconds(value: float | str) -> str:
    if isinstance(value, (int, float)) and float(value).is_integer():
        return str(int(value))
    return str(value)


# What llama.cpp's jinja engine answers when a strict template raises (abridged).
STRICT_ROLES_ERROR = ("Unable to generate parser for this template. Automatic parser "
                      "generation failed: Error: Jinja Exception: Conversation roles must "
                      "alternate user/assistant/user/assistant/...")


def _alternate(messages: list[dict[str, Any]]) -> bool:
    """After any system messages: user, assistant, user, ... (the strict templates' rule)."""
    roles = [m.get("role") for m in messages if m.get("role") != "system"]
    return all(role == ("user" if i % 2 == 0 else "assistant") for i, role in enumerate(roles))


def _non_text_refusal(messages: list[Any]) -> tuple[int, str] | None:
    """llama.cpp's answer to a part a text-only model cannot take, else None."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                return 500, "image input is not supported - hint: if this is unexpected, " \
                    "you may need to provide the mmproj"
            if kind not in ("text", None):
                return 400, f"unsupported content[].type: {kind}"
    return None


def _event_message(fault: Fault) -> str:
    """The message of a mid-stream error event: the scripted one, else the status's."""
    if fault.message:
        return fault.message
    return "Overloaded (fake)" if fault.status in (503, 529) else \
        default_error_message(fault.status)
