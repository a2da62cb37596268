"""Reading OpenAI chat completion replies and stream chunks, strictly.

Both backends hand decoded JSON here, so a reply that is not shaped like an
OpenAI chat completion fails the same way whichever client fetched it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from ._policy import AttemptFailed

MAX_PROVIDER_MESSAGE = 1000
"""How much of a provider's error text an error message shows (on one line)."""
_RAW_LIMIT = 8000  # what is kept of an error body at all

Usage = dict[str, "int | dict[str, int]"]


class Reply(NamedTuple):
    text: str
    model: str | None
    usage: Usage | None
    finish_reason: str | None


def _malformed(detail: str) -> AttemptFailed:
    return AttemptFailed("malformed", f"malformed reply: {detail}")


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _usage(value: object) -> Usage | None:
    """Token counts, keeping one level of detail (``prompt_tokens_details.cached_tokens``)."""
    if not isinstance(value, Mapping):
        return None
    out: Usage = {}
    for k, v in value.items():
        if not isinstance(k, str):
            continue
        if _count(v):
            out[k] = v
        elif isinstance(v, Mapping):
            inner = {ik: iv for ik, iv in v.items() if isinstance(ik, str) and _count(iv)}
            if inner:
                out[k] = inner
    return out


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_completion(data: object) -> Reply:
    """A non-streamed chat completion -> Reply; AttemptFailed("malformed") if misshapen."""
    if not isinstance(data, Mapping):
        raise _malformed("expected a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise _malformed("no choices in the chat completion")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise _malformed("choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _malformed("message content is not text")
    return Reply(content or "", _str_or_none(data.get("model")), _usage(data.get("usage")),
                 _str_or_none(choices[0].get("finish_reason")))


class StreamAccumulator:
    """Folds stream chunks into the reply so far; ``feed`` returns each chunk's text."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self.model: str | None = None
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def reply(self) -> Reply:
        return Reply(self.text, self.model, self.usage, self.finish_reason)

    def feed(self, chunk: object) -> str:
        if not isinstance(chunk, Mapping):
            raise _malformed("stream chunk is not a JSON object")
        error = stream_error(chunk)
        if error is not None:
            raise AttemptFailed("provider", "the provider reported an error mid-stream",
                                provider_message=error[0], retryable=error[1])
        self.model = _str_or_none(chunk.get("model")) or self.model
        self.usage = _usage(chunk.get("usage")) or self.usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise _malformed("stream chunk has no choices list")
        if not choices:  # the final usage-only chunk
            return ""
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not isinstance(delta, Mapping):
            raise _malformed("stream chunk has no delta")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise _malformed("stream delta content is not text")
        self.finish_reason = _str_or_none(choice.get("finish_reason")) or self.finish_reason
        if content:
            self._parts.append(content)
        return content or ""


def provider_message(body: object) -> str | None:
    """The provider's own error text from an error body (JSON object or raw text)."""
    if isinstance(body, (bytes, str)):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(text)
        except ValueError:
            return text.strip()[:_RAW_LIMIT] or None
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            error = error.get("message")
        if isinstance(error, str) and error:
            return error[:_RAW_LIMIT]
    return None


def stream_error(chunk: Mapping[str, Any]) -> tuple[str, bool] | None:
    """An ``{"error": ...}`` event inside a stream -> (message, retryable), else None."""
    error = chunk.get("error")
    if not error:
        return None
    message = provider_message(chunk) or "the provider reported an error mid-stream"
    kind = error.get("type") if isinstance(error, Mapping) else None
    return message, kind in ("server_error", "overloaded_error", "rate_limit_error")


# llama.cpp: "request (831 tokens) exceeds the available context size (512 tokens)";
# OpenAI: "maximum context length is 8192 tokens. However, your messages resulted in 9000
# tokens"; vLLM: "maximum context length is 2048 tokens. However, you requested 2100 tokens".
_LLAMA_OVERFLOW = re.compile(r"\((\d+) tokens\) exceeds the available context size "
                             r"\((\d+) tokens\)")
_OPENAI_OVERFLOW = re.compile(r"maximum context length is (\d+) tokens.*?"
                              r"(?:resulted in|requested) (\d+) tokens", re.S)
_OVERFLOW_WORDS = ("exceeds the available context size", "maximum context length",
                   "context_length_exceeded", "exceed_context_size")


def context_overflow(body: object) -> tuple[int | None, int | None] | None:
    """(window, prompt tokens) when an error body says the prompt does not fit, else None.

    Either number may be None when the provider does not say it.
    """
    if isinstance(body, (bytes, str)):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(text)
        except ValueError:
            body = {"error": {"message": text}}
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return None
    text = " ".join(str(error.get(k, "")) for k in ("message", "type", "code"))
    if not any(word in text for word in _OVERFLOW_WORDS):
        return None
    window, prompt = error.get("n_ctx"), error.get("n_prompt_tokens")
    llama, openai = _LLAMA_OVERFLOW.search(text), _OPENAI_OVERFLOW.search(text)
    if llama:
        prompt, window = int(llama.group(1)), int(llama.group(2))
    elif openai:
        window, prompt = int(openai.group(1)), int(openai.group(2))
    return (window if _count(window) else None, prompt if _count(prompt) else None)
