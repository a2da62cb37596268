"""The default backend: a dialect's requests over plain httpx2, JSON and SSE.

It sends ``POST {base_url}{dialect.path}`` (``/chat/completions`` by default), so
it works with any OpenAI-compatible server and keeps the openai SDK out of the
import path. Every httpx2 error is translated into ``AttemptFailed`` in
``_translate``, around the request and around the stream iteration alike.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Generator, Iterator, Mapping
from typing import Any

import httpx2

from chatstate.adapter._env import DEFAULTS
from chatstate.adapter._policy import AttemptFailed
from chatstate.adapter.backends._http import http_failure
from chatstate.adapter.dialects.base import Dialect
from chatstate.adapter.dialects.chat_completions import CHAT_COMPLETIONS
from chatstate.core.redact import redact_url

__all__ = ["WireBackend"]


class WireBackend:
    """A Backend over an httpx2 client that this object owns (or one passed in)."""

    def __init__(self, base_url: str, api_key: str | None = None, *,
                 timeout: float | None = DEFAULTS.timeout,
                 connect_timeout: float = DEFAULTS.connect_timeout,
                 http_client: httpx2.Client | None = None,
                 dialect: Dialect = CHAT_COMPLETIONS) -> None:
        self.dialect = dialect
        self._base = base_url.rstrip("/")
        self._url = self._base + dialect.path
        self.endpoint = redact_url(self._url)  # what messages show: never user:password
        self.secret = api_key
        self.timeout = timeout
        self._owns_client = http_client is None
        self._client = http_client or httpx2.Client(
            timeout=httpx2.Timeout(timeout, connect=_min(connect_timeout, timeout)),
            verify=_verify(self._url))
        self._headers = {"User-Agent": "chatstate", **dialect.headers(api_key)}

    def __repr__(self) -> str:  # the default repr would be fine today; keep it key-free by design
        return f"WireBackend(endpoint={self.endpoint!r})"

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def send(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        with _translate():
            response = self._client.post(self._url, json=dict(body), headers=self._headers)
            self._raise_for_status(response)
            return _decode(response.content, "response body")

    def get(self, path: str) -> Mapping[str, Any]:
        """GET ``{base_url}{path}`` (``/models``) and return the decoded JSON reply."""
        with _translate():
            response = self._client.get(self._base + path, headers=self._headers)
            self._raise_for_status(response)
            return _decode(response.content, "response body")

    def stream(self, body: Mapping[str, Any]) -> Generator[Mapping[str, Any], None, None]:
        headers = {**self._headers, "Accept": "text/event-stream"}
        with _translate(), self._client.stream("POST", self._url, json=dict(body),
                                               headers=headers) as response:
            self._raise_for_status(response)
            done, end = False, self.dialect.sse_done
            for data in self._event_data(response):
                if done:
                    continue  # drain to the end of the body so the connection is reused
                if end is not None and data.strip() == end:
                    done = True
                    continue
                yield _decode(data, "SSE event")

    def _event_data(self, response: httpx2.Response) -> Iterator[str]:
        for event in httpx2.EventSource(response):
            if event.event not in self.dialect.sse_events:
                continue  # other named events (pings) carry no data of the dialect's
            yield event.data

    def _raise_for_status(self, response: httpx2.Response) -> None:
        if response.status_code < 400:
            return
        raise http_failure(self.dialect, response.status_code, response.read(),
                           response.headers)


def _verify(url: str) -> ssl.SSLContext | bool:
    """TLS settings for a client that only ever asks ``url`` (it follows no redirects).

    For a plain http:// endpoint (a local model) no CA bundle is loaded, which costs a
    cold start tens of milliseconds: the context verifies (hostname and certificate
    required) but trusts no CA, so a TLS connection it was never meant to make, to a
    proxy say, fails closed instead of going unchecked."""
    if url.lower().startswith("http://"):
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return True


def _min(a: float, b: float | None) -> float:
    return a if b is None else min(a, b)


def _decode(raw: bytes | str, what: str) -> Mapping[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        raise AttemptFailed("malformed", f"malformed {what} (not JSON): {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise AttemptFailed("malformed", f"malformed {what}: expected a JSON object")
    return value


@contextlib.contextmanager
def _translate() -> Iterator[None]:
    """Map httpx2 errors to AttemptFailed, most specific first (the one place this happens)."""
    try:
        yield
    except httpx2.SSEError as exc:
        raise AttemptFailed("malformed", f"malformed event stream: {exc}") from exc
    except httpx2.TimeoutException as exc:
        raise AttemptFailed("timeout", f"timed out ({type(exc).__name__})",
                            retryable=True) from exc
    except httpx2.UnsupportedProtocol as exc:
        raise AttemptFailed("connect", f"unsupported URL: {exc}") from exc
    except httpx2.ConnectError as exc:
        raise AttemptFailed("connect", f"could not connect: {exc}", retryable=True) from exc
    except httpx2.TransportError as exc:
        raise AttemptFailed("cut", f"the connection dropped: {exc}", retryable=True) from exc
    except httpx2.DecodingError as exc:
        raise AttemptFailed("malformed", f"undecodable response: {exc}") from exc
    except httpx2.InvalidURL as exc:
        raise AttemptFailed("connect", f"invalid URL: {exc}") from exc
