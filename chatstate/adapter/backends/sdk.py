"""A backend over a caller's ``openai.OpenAI`` client (for its auth, proxies, providers).

The client is copied with ``max_retries=0``: the adapter's retry loop is the
only one, so the SDK's retries cannot multiply with ours, and a stream that
drops mid-way (which the SDK never retries) is covered too. Every openai
error is translated into ``AttemptFailed`` in ``_translate``.

The SDK has one method per wire API, so this backend speaks the dialects it
has a method for (``_CALLS``); the reply is handed back as plain JSON for the
dialect to decode, as from the wire backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import httpx2
import openai

from chatstate.adapter._env import DEFAULTS
from chatstate.adapter._policy import AttemptFailed
from chatstate.adapter.backends._http import http_failure
from chatstate.adapter.dialects.base import Dialect
from chatstate.adapter.dialects.chat_completions import CHAT_COMPLETIONS
from chatstate.core.redact import redact_url

__all__ = ["SdkBackend"]

# Sent as keyword arguments; every other request field travels in extra_body,
# so per-call params the SDK does not know yet still reach the server.
_KWARGS = ("model", "messages", "stream", "stream_options", "tools", "tool_choice")


def _chat_completions(client: openai.OpenAI, body: Mapping[str, Any]) -> Any:
    kwargs = {k: body[k] for k in _KWARGS if k in body}
    extra = {k: v for k, v in body.items() if k not in _KWARGS}
    return client.chat.completions.create(**kwargs, extra_body=extra or None)


_RESPONSES_KWARGS = ("model", "input", "stream", "tools", "tool_choice", "include")


def _responses(client: openai.OpenAI, body: Mapping[str, Any]) -> Any:
    kwargs = {k: body[k] for k in _RESPONSES_KWARGS if k in body}
    extra = {k: v for k, v in body.items() if k not in _RESPONSES_KWARGS}
    return client.responses.create(**kwargs, extra_body=extra or None)


# dialect name -> the SDK call that sends its request body
_CALLS: dict[str, Callable[[openai.OpenAI, Mapping[str, Any]], Any]] = {
    CHAT_COMPLETIONS.name: _chat_completions,
    "responses": _responses,
}


class SdkBackend:
    """A Backend that sends requests through the client's method for the dialect
    (``client.chat.completions.create`` for chat completions)."""

    def __init__(self, client: openai.OpenAI, *, timeout: float | None = None,
                 connect_timeout: float = DEFAULTS.connect_timeout,
                 dialect: Dialect = CHAT_COMPLETIONS) -> None:
        call = _CALLS.get(dialect.name)
        if call is None:
            # There is no Anthropic SDK backend: the built-in one speaks Anthropic Messages.
            raise ValueError(f"an openai.OpenAI client cannot speak the {dialect.name!r} api "
                             f"(it speaks {', '.join(sorted(_CALLS))}) and chatstate has no "
                             f"backend for another SDK: drop client= and pass base_url= and "
                             f"api_key= with api={dialect.name!r} (the built-in httpx2 "
                             "backend speaks it), or choose one of those apis")
        self.dialect = dialect
        self._call = call
        if timeout is not None:
            client = client.with_options(
                max_retries=0, timeout=httpx2.Timeout(timeout, connect=min(connect_timeout,
                                                                           timeout)))
        else:
            client = client.with_options(max_retries=0)
        self._client = client
        self.endpoint = redact_url(str(client.base_url).rstrip("/") + dialect.path)
        key = getattr(client, "api_key", None)
        self.secret = key if isinstance(key, str) else None
        configured = client.timeout
        self.timeout = (configured.read if isinstance(configured, httpx2.Timeout)
                        else configured if isinstance(configured, (int, float)) else None)

    def __repr__(self) -> str:
        return f"SdkBackend(endpoint={self.endpoint!r})"

    def close(self) -> None:
        """The client belongs to the caller; it is theirs to close."""

    def send(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        with _translate(self.dialect):
            reply: Mapping[str, Any] = self._create(body).to_dict()
            return reply

    def get(self, path: str) -> Mapping[str, Any]:
        """GET ``path`` (``/models``) through the client; the decoded JSON reply."""
        with _translate(self.dialect):
            cast_to: Any = object  # the JSON as it came, not a typed SDK model
            reply: Mapping[str, Any] = self._client.get(path, cast_to=cast_to)
            return reply

    def stream(self, body: Mapping[str, Any]) -> Generator[Mapping[str, Any], None, None]:
        with _translate(self.dialect), self._create(body) as chunks:
            for chunk in chunks:
                yield chunk.to_dict()

    def _create(self, body: Mapping[str, Any]) -> Any:
        return self._call(self._client, body)


@contextlib.contextmanager
def _translate(dialect: Dialect) -> Iterator[None]:
    """Map openai errors to AttemptFailed, most specific first (the one place this happens)."""
    try:
        yield
    except openai.APITimeoutError as exc:
        raise AttemptFailed("timeout", "timed out", retryable=True) from exc
    except openai.APIConnectionError as exc:
        if isinstance(exc.__cause__, httpx2.ConnectError):
            raise AttemptFailed("connect", f"could not connect: {exc.__cause__}",
                                retryable=True) from exc
        raise AttemptFailed("cut", f"the connection dropped: {exc.__cause__ or exc}",
                            retryable=True) from exc
    except openai.APIStatusError as exc:
        raise http_failure(dialect, exc.status_code, exc.body, exc.response.headers) from exc
    except openai.APIResponseValidationError as exc:
        raise AttemptFailed("malformed", f"malformed reply: {exc.message}") from exc
    except openai.APIError as exc:
        raise AttemptFailed("provider", "the provider reported an error",
                            provider_message=exc.message) from exc
    except ValueError as exc:  # the SDK's SSE decoder lets json.JSONDecodeError through
        raise AttemptFailed("malformed", f"malformed reply (not JSON): {exc}") from exc
