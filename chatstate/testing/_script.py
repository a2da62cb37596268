"""What the fake model will do next: queued faults, content rules, options and the log.

``Controls`` is the scripting API. ``FakeModel`` (same process) and
``FakeControl`` (over HTTP, for a fake in another process) both inherit it,
so the two can never drift apart: each only says how a command is delivered.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Controls", "Fault", "Options", "Rule", "Script", "ToolRule"]


@dataclass
class Fault:
    """A misbehaviour for the next ``times`` chat requests.

    kind: ``fail`` (answer ``status``), ``rule`` (the same, from a content
    rule), ``cut`` (drop the connection after ``after_chunks`` content chunks;
    ``clean`` ends the body properly but without finish_reason or [DONE]),
    ``hang`` (say nothing for ``seconds``, then answer normally),
    ``malformed`` (a reply that is not valid JSON/SSE), ``error_event`` (a stream that
    sends ``after_chunks`` content chunks, then an error event in the shape of the API
    it answers, for ``status`` and with ``message``, as a provider failing
    mid-generation does, and ends, ``seconds`` after it), ``html`` (a 200 whose body is
    an HTML page, as a captive portal or a misrouted proxy answers).
    """

    kind: str
    times: int = 1
    status: int = 500
    retry_after: float | str | None = None
    message: str | None = None
    after_chunks: int = 1
    clean: bool = False
    seconds: float = 0.0


@dataclass
class Rule:
    """Every chat request whose last user message contains ``contains`` fails with ``status``."""

    contains: str
    status: int = 500
    retry_after: float | str | None = None
    message: str | None = None


@dataclass
class ToolRule:
    """While the last user message contains ``contains``, the reply calls tools.

    ``calls`` are ``{"name": ..., "arguments": {...} or "raw string"}``, all asked for in
    one reply (after ``text``, if any). ``rounds`` is how many replies of the turn call
    them; the reply after the last round reads the tool results back.
    """

    contains: str
    calls: list[dict[str, Any]]
    text: str = ""
    rounds: int = 1


@dataclass
class Options:
    latency: float = 0.0
    """Seconds before the response headers of every chat request."""
    chunk_delay: float = 0.0
    """Seconds between stream chunks."""
    reply_words: int = 8
    """Filler words after "Echo: <last user content>"."""
    model: str = "fake-model"
    """Model name in replies when the request names none, and in /v1/models."""
    strict_roles: bool = False
    """Reject (400) a request whose user/assistant messages do not alternate, as the strict
    chat templates of Mistral or Gemma do under llama.cpp's jinja engine."""
    context_window: int | None = None
    """Prompt tokens (counted as ``usage`` counts them) past which a request gets the
    OpenAI-style 400 "maximum context length is N tokens"; None: no limit."""
    arg_chunk: int = 0
    """Streamed tool call arguments come in pieces of this many characters (0: whole)."""
    token_scale: float = 1.0
    """The fake's tokenizer counts this many tokens per word for the context window, as a
    provider whose tokenizer differs from the client's estimate does."""
    overflow_style: str = "openai"
    """How a request past ``context_window`` is refused: "openai" (its 400 text) or
    "llama" (llama.cpp's JSON with ``n_prompt_tokens`` and ``n_ctx``)."""
    reply_headers: dict[str, str] = field(default_factory=dict)
    """Headers every chat answer carries (besides its ``x-request-id``), e.g.
    ``{"x-ratelimit-remaining-requests": "99"}``."""
    text_only: bool = False
    """Refuse content parts other than text as llama.cpp's server does for a model without
    a vision projector: images with a 500 "image input is not supported", file parts with a
    400 "unsupported content[].type"."""
    responses_cut_status: str = "incomplete"
    """The Responses ``status`` of a reply cut by ``max_output_tokens``: "incomplete" (with
    ``incomplete_details``, as OpenAI says it) or "completed" (as llama.cpp says it)."""
    ascii_json: bool = True
    """Escape every non-ASCII character of the replies and events it writes (as Python's
    ``json`` does); False writes them as UTF-8, as llama.cpp's server and vLLM do, so an
    event's data may hold U+2028, U+2029 or U+0085 raw (a line break to
    ``str.splitlines``, not to an event stream)."""


@dataclass
class Script:
    """The fake's mutable state, shared by the server threads. Every access holds ``lock``."""

    options: Options = field(default_factory=Options)
    faults: deque[Fault] = field(default_factory=deque)
    rules: list[Rule] = field(default_factory=list)
    tool_rules: list[ToolRule] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_behaviour(self, last_user: str) -> Fault | None:
        """Consume one use of the head fault; else the first matching rule (as a
        Fault of kind "rule"); else None, meaning a normal reply."""
        with self.lock:
            if self.faults:
                fault = self.faults[0]
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.popleft()
                return fault
            rule = next((r for r in self.rules if r.contains in last_user), None)
        if rule is None:
            return None
        return Fault("rule", status=rule.status, retry_after=rule.retry_after,
                     message=rule.message)

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry.setdefault("time", time.time())
        with self.lock:
            self.log.append(entry)
        return entry

    def apply(self, command: str, args: dict[str, Any]) -> Any:
        """Run one control command (the HTTP control endpoint and FakeModel both land here).

        Raises TypeError for bad arguments and ValueError for an unknown command.
        """
        with self.lock:
            if command in _FAULT_KINDS:
                self.faults.append(Fault(_FAULT_KINDS[command], **args))
            elif command == "add_rule":
                self.rules.append(Rule(**args))
            elif command == "add_tool_rule":
                self.tool_rules.append(ToolRule(**args))
            elif command == "configure":
                self._configure(args)
            elif command == "reset":
                self.faults.clear()
                self.rules.clear()
                self.tool_rules.clear()
                self.log.clear()
            elif command == "log":
                return [dict(e) for e in self.log]
            elif command == "state":
                return {"options": asdict(self.options),
                        "faults": [asdict(f) for f in self.faults],
                        "rules": [asdict(r) for r in self.rules],
                        "tool_rules": [asdict(r) for r in self.tool_rules]}
            else:
                raise ValueError(f"unknown command {command!r}")
        return None

    def _configure(self, args: dict[str, Any]) -> None:
        unknown = sorted(set(args) - set(asdict(self.options)))
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}")
        for key, value in args.items():
            setattr(self.options, key, value)


_FAULT_KINDS = {"fail_next": "fail", "cut_stream_next": "cut", "hang_next": "hang",
                "malformed_next": "malformed", "error_event_next": "error_event",
                "html_next": "html"}


class Controls(ABC):
    """The scripting API of the fake model. Subclasses deliver commands via ``_command``."""

    @abstractmethod
    def _command(self, command: str, args: dict[str, Any]) -> Any:
        """Deliver ``command`` to the fake (in-process, or over HTTP) and return its answer."""

    def fail_next(self, status: int = 429, *, times: int = 1,
                  retry_after: float | str | None = None, message: str | None = None) -> None:
        """The next ``times`` chat requests answer ``status`` (with Retry-After if given)."""
        self._command("fail_next", {"status": status, "times": times,
                                    "retry_after": retry_after, "message": message})

    def cut_stream_next(self, after_chunks: int = 1, *, times: int = 1,
                        clean: bool = False) -> None:
        """The next ``times`` chat requests send ``after_chunks`` content chunks, then drop.

        Without ``clean`` the connection closes mid-body (a network cut); with it
        the body ends properly but with no finish_reason and no [DONE]. A
        non-streamed request gets half its JSON body, then the connection drops.
        """
        self._command("cut_stream_next", {"after_chunks": after_chunks, "times": times,
                                          "clean": clean})

    def hang_next(self, seconds: float, *, times: int = 1) -> None:
        """The next ``times`` chat requests get nothing for ``seconds``, then a normal reply."""
        self._command("hang_next", {"seconds": seconds, "times": times})

    def malformed_next(self, *, times: int = 1) -> None:
        """The next ``times`` chat requests get a 200 whose body is not valid JSON/SSE."""
        self._command("malformed_next", {"times": times})

    def error_event_next(self, after_chunks: int = 1, *, status: int = 500, times: int = 1,
                         message: str | None = None, linger: float = 0.0) -> None:
        """The next ``times`` streamed requests send ``after_chunks`` content chunks, then
        an error event in their API's shape, as a provider failing mid-generation does, and
        end the body (no finish, no [DONE]): chat completions ``data: {"error": {...}}``,
        Responses ``event: error`` (``code`` ``server_error``, or ``rate_limit_exceeded``
        for 429), Anthropic ``event: error`` (``overloaded_error`` for 529, ``api_error``
        for another 5xx). ``message`` defaults to "Overloaded (fake)" for 503 and 529.
        ``linger``: seconds the body stays open after the error event before it ends (the
        event and the end of the body reach a reader apart, as over a real network)."""
        self._command("error_event_next", {"after_chunks": after_chunks, "status": status,
                                           "times": times, "message": message,
                                           "seconds": linger})

    def html_next(self, *, times: int = 1) -> None:
        """The next ``times`` chat requests get a 200 ``text/html`` page instead of a reply."""
        self._command("html_next", {"times": times})

    def add_rule(self, *, contains: str, status: int = 500,
                 retry_after: float | str | None = None, message: str | None = None) -> None:
        """Until reset, every request whose last user message contains the text fails."""
        self._command("add_rule", {"contains": contains, "status": status,
                                   "retry_after": retry_after, "message": message})

    def add_tool_rule(self, *, contains: str, calls: list[dict[str, Any]], text: str = "",
                      rounds: int = 1) -> None:
        """Until reset, a turn whose last user message contains the text calls tools.

        ``calls``: ``[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]``, all in
        one reply; arguments given as a string are sent as they are (even if not JSON), and
        an ``"id"`` given is the call's id (a model that repeats one, or sends ``""``).
        The turn's first ``rounds`` replies call them; the next one reads the results:
        ``"Tool results: <tool_call_id>=<content>; ..."``. Call ids are derived from the
        messages, so a retried request gets the same ids.
        """
        self._command("add_tool_rule", {"contains": contains, "calls": list(calls),
                                        "text": text, "rounds": rounds})

    def configure(self, **options: Any) -> None:
        """Change latency, chunk_delay, reply_words, model, strict_roles, context_window or
        arg_chunk for the requests that follow."""
        self._command("configure", dict(options))

    def reset(self) -> None:
        """Forget queued faults, rules, tool rules and the request log (options stay)."""
        self._command("reset", {})

    def state(self) -> dict[str, Any]:
        """The fake's options, queued faults, rules and tool rules."""
        result: dict[str, Any] = self._command("state", {})
        return result

    @property
    def request_log(self) -> list[dict[str, Any]]:
        """One dict per API request, oldest first (a copy).

        Keys: time (epoch seconds at arrival), method, path, body (the JSON
        request), messages, model, stream, authorization (whether the header
        was present; never its value), status, behaviour (ok, fail, rule, cut,
        hang, malformed, strict, context: past the context window).
        """
        log: list[dict[str, Any]] = self._command("log", {})
        return log
