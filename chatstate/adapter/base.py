"""The stateless model adapter: its types, its one backend seam and its one retry loop.

An adapter takes the whole message list on every call and returns a reply; it
keeps no conversation state (invariant 10). The HTTP work sits behind a
``Backend`` of two methods (one request, one streamed request), which the
httpx2 wire client and the openai SDK client both implement (``backends/``).
The request and reply format is the backend's ``Dialect`` (``dialects/``): the
loop has it encode each request and decode each reply and stream event, and
the backend sends the body to the dialect's path. Each backend translates its
foreign errors into ``AttemptFailed`` in exactly one place; the
``RetryingAdapter`` below owns the single retry loop that every backend and
dialect share, so the retry rules, the Retry-After handling and the error
texts exist once.

A stream that drops after it started is retried too: the new stream must
re-produce the text already yielded, which is swallowed; if it diverges the
adapter raises rather than yield text that contradicts what the caller shows.

Tool calls (requested with ``tools``/``tool_choice`` in ``params``) are not
text: a stream never yields them piecemeal, only whole, in the final
Completion, assembled from the one attempt that finished. So a retry cannot
show half a call, and nothing of a call from a failed attempt survives.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from chatstate.adapter._policy import AttemptFailed, RetryPolicy, timeout_advice, to_model_error
from chatstate.adapter.dialects.base import Dialect, Usage
from chatstate.errors import ModelError

log = logging.getLogger("chatstate.adapter")

__all__ = [
    "AttemptFailed",
    "Backend",
    "Completion",
    "ModelAdapter",
    "RetryingAdapter",
]


@dataclass(frozen=True)
class Completion:
    """A whole reply: its text, the model that wrote it, token usage and why it stopped.

    ``tool_calls`` are the calls the model asked for, in chat-completions form
    (``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments the
    raw JSON string as sent); ``extra`` holds other message fields a later request
    may need (``refusal``, ``reasoning``), as the provider sent them.
    """

    text: str
    model: str | None
    usage: Usage | None
    finish_reason: str | None
    tool_calls: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


@runtime_checkable
class ModelAdapter(Protocol):
    """What the session calls. Holds no conversation state: every call gets the full list."""

    model: str
    """The model used when a call does not name one."""

    def complete(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
                 params: Mapping[str, Any] | None = None) -> Completion:
        """Return the whole reply, retrying transient failures; raise ModelError when out."""
        ...

    def stream(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
               params: Mapping[str, Any] | None = None) -> Iterator[str | Completion]:
        """Yields text deltas (str) and, last, one Completion whose text is the whole reply.

        The deltas concatenate to ``Completion.text``; tool calls come only whole,
        in the Completion. A retried stream never
        yields a character twice, and never yields text that contradicts what
        was already yielded: it raises ModelError(retryable=True) instead.
        """
        ...


class Backend(Protocol):
    """One HTTP client for a model endpoint, speaking one dialect. Raises only AttemptFailed."""

    dialect: Dialect
    """The wire API its requests are in: it sends them to ``dialect.path``."""
    endpoint: str
    """Where requests go (no credentials), for error messages."""
    secret: str | None
    """The API key, so that error texts can be scrubbed of it."""
    timeout: float | None
    """The read timeout in seconds, for error advice."""

    def send(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """POST a request the dialect encoded and return the decoded JSON reply."""
        ...

    def stream(self, body: Mapping[str, Any]) -> Generator[Mapping[str, Any], None, None]:
        """POST a streamed request and yield each decoded event until the stream ends."""
        ...

    def close(self) -> None:
        """Release connections this backend opened (not a caller-owned client)."""
        ...


Attempt = Callable[[], Generator["str | Completion", None, None]]


class RetryingAdapter:
    """A ModelAdapter over any Backend, with the retry loop that every backend shares.

    It speaks the backend's dialect: one object says both where a request goes and
    what it looks like, so the two cannot disagree.
    """

    def __init__(self, backend: Backend, *, model: str,
                 policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.dialect = backend.dialect
        self.model = model
        self.policy = policy or RetryPolicy()
        self._sleep = sleep

    def __repr__(self) -> str:  # never show the backend's secret
        return f"RetryingAdapter(endpoint={self.backend.endpoint!r}, model={self.model!r})"

    def close(self) -> None:
        self.backend.close()

    def complete(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
                 params: Mapping[str, Any] | None = None) -> Completion:
        body = self.dialect.encode(messages, model=model or self.model, params=params,
                                   stream=False)

        def attempt() -> Generator[str | Completion, None, None]:
            yield Completion(*self.dialect.settle(self.dialect.decode(self.backend.send(body)),
                                                     body))

        for item in self._run(attempt):
            if isinstance(item, Completion):
                return item
        raise AssertionError("unreachable: _run always ends with a Completion")

    def stream(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
               params: Mapping[str, Any] | None = None) -> Iterator[str | Completion]:
        body = self.dialect.encode(messages, model=model or self.model, params=params,
                                   stream=True)

        def attempt() -> Generator[str | Completion, None, None]:
            acc = self.dialect.stream_decoder()
            with contextlib.closing(self.backend.stream(body)) as chunks:
                for chunk in chunks:
                    delta = acc.feed(chunk)
                    if delta:
                        yield delta
            if acc.finish_reason is None:
                # No finish_reason means the stream stopped early, even if cleanly.
                raise AttemptFailed("cut", "the stream ended before the reply was finished",
                                    retryable=True)
            yield Completion(*self.dialect.settle(acc.reply(), body))

        return self._run(attempt)

    def list_models(self) -> list[str]:
        """The model ids the endpoint lists (``GET /models``), through the same retry loop.

        Raises ModelError when the endpoint has no such list (HTTP 404) or fails."""
        get = getattr(self.backend, "get", None)
        if get is None:
            raise ModelError(f"{type(self.backend).__name__} cannot list models (it has no "
                             "get method)")

        def attempt() -> Generator[str | Completion, None, None]:
            reply = get("/models")
            data = reply.get("data") if isinstance(reply, Mapping) else None
            if not isinstance(data, list):
                raise AttemptFailed("malformed", "malformed /models reply: no data list")
            ids = sorted(str(m["id"]) for m in data if isinstance(m, Mapping) and "id" in m)
            yield Completion("\n".join(ids), None, None, "stop")

        for item in self._run(attempt):
            if isinstance(item, Completion):
                return [line for line in item.text.split("\n") if line]
        raise AssertionError("unreachable: _run always ends with a Completion")

    def _run(self, attempt: Attempt) -> Iterator[str | Completion]:
        """The one retry loop: run attempts until one finishes, yielding each new character once.

        ``shown`` is everything already yielded to the caller. A later attempt's
        text is matched against it: the matching prefix is swallowed, only the
        text beyond it is yielded, and a mismatch ends the call.
        """
        shown, told_timeout = "", False
        for number in itertools.count(1):
            received = 0
            try:
                with contextlib.closing(attempt()) as items:
                    for item in items:
                        if isinstance(item, Completion):
                            yield self._check_final(item, shown)
                            return
                        new = self._unseen(item, shown, received)
                        received += len(item)
                        if new:
                            shown += new
                            yield new
            except AttemptFailed as failure:
                delay = self.policy.delay(failure, number)
                if delay is None:
                    raise self._error(failure, number, len(shown)) from failure
                # status and kind only: a provider's message could echo what it was sent
                what = f"HTTP {failure.status}" if failure.status else failure.kind
                hint = ""
                if failure.kind == "timeout" and not told_timeout:
                    # said once: a frozen server otherwise costs (retries + 1) x timeout
                    hint, told_timeout = f" ({timeout_advice(self.backend.timeout)})", True
                log.warning("%s: attempt %d failed (%s)%s; %d attempts in all; "
                            "retrying in %.2f s",
                            self.backend.endpoint, number, what, hint,
                            self.policy.max_retries + 1, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")

    def _unseen(self, delta: str, shown: str, received: int) -> str:
        """The part of ``delta`` (which starts at offset ``received``) not yet shown."""
        overlap = shown[received:received + len(delta)]
        if delta[:len(overlap)] != overlap:
            raise self._diverged(len(shown))
        return delta[len(overlap):]

    def _check_final(self, completion: Completion, shown: str) -> Completion:
        if completion.text != shown and shown:
            raise self._diverged(len(shown))
        return completion

    def _diverged(self, chars: int) -> ModelError:
        return ModelError(
            f"model stream from {self.backend.endpoint} was cut after {chars} characters and "
            "the retried request produced a different reply, so it was not continued; "
            "retry the turn to get a fresh reply.",
            retryable=True,
        )

    def _error(self, failure: AttemptFailed, attempts: int, shown: int) -> ModelError:
        _drop_leaky_causes(failure, self.backend.secret)
        return to_model_error(failure, attempts=attempts, endpoint=self.backend.endpoint,
                              secret=self.backend.secret, timeout=self.backend.timeout,
                              shown_chars=shown)


def _drop_leaky_causes(failure: AttemptFailed, secret: str | None) -> None:
    """Cut the chain below ``failure`` if any foreign exception in it quotes the key.

    Providers and proxies sometimes echo the key they rejected; a traceback
    printing that chain would put it on screen or in a log (invariant 9).
    """
    link: BaseException | None = failure.__cause__ or failure.__context__
    while secret and link is not None:
        if secret in str(link) or secret in repr(link):
            failure.__cause__ = failure.__context__ = None
            failure.__suppress_context__ = True
            return
        link = link.__cause__ or link.__context__
