"""When to retry, how long to wait, and what to tell the user when retries run out.

Retried: 408, 409, 429, every 5xx, connection errors, timeouts and streams cut
short. Not retried: other 4xx (the same request would fail the same way) and
malformed replies (a proxy or a non-compatible server; waiting does not help).
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chatstate.adapter._env import DEFAULTS
from chatstate.core.redact import scrub
from chatstate.errors import ModelError

if TYPE_CHECKING:
    from collections.abc import Mapping

RETRYABLE_STATUS = frozenset({408, 409, 429})
MAX_PROVIDER_MESSAGE = 1000
"""How much of a provider's error text an error message shows (on one line)."""


class AttemptFailed(Exception):
    """One attempt failed. Raised by backends, consumed by the retry loop; never escapes.

    ``kind`` is one of: http, timeout, connect, cut, malformed, provider.
    """

    def __init__(self, kind: str, detail: str, *, status: int | None = None,
                 provider_message: str | None = None, retryable: bool = False,
                 retry_after: float | None = None,
                 overflow: tuple[int | None, int | None] | None = None,
                 refused: str | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.provider_message = provider_message
        self.retryable = retryable
        self.retry_after = retry_after
        self.overflow = overflow
        """(context window, prompt tokens) when the provider said the prompt does not fit."""
        self.refused = refused
        """"images" or "files": the model does not take that input (see refused_input)."""


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


# A model that does not take a kind of input says so, some with a 500 (llama.cpp: "image
# input is not supported"; "unsupported content[].type"); the same request always fails.
_REFUSED_IMAGES = re.compile(
    r"image input is not supported|does not support (?:image|vision)|"
    r"image_url is only supported|not a multimodal model|multimodal is not supported|"
    r"vision is not supported", re.I)
_REFUSED_PARTS = re.compile(r"unsupported content\[\]\.type|file input is not supported|"
                            r"does not support (?:file|document)s?\b", re.I)


def refused_input(provider_message: str | None) -> str | None:
    """"images" or "files" when the provider says the model does not take that input."""
    if not provider_message:
        return None
    if _REFUSED_IMAGES.search(provider_message):
        return "images"
    if _REFUSED_PARTS.search(provider_message):
        return "files"
    return None


@dataclass
class RetryPolicy:
    """Exponential backoff with jitter, overridden by the server's Retry-After.

    ``max_retries`` counts retries, so a call makes at most ``max_retries + 1``
    requests. A Retry-After longer than ``retry_after_max`` is capped there:
    a provider asking for minutes would otherwise hang an interactive turn.
    """

    max_retries: int = DEFAULTS.max_retries
    backoff_base: float = DEFAULTS.backoff_base
    backoff_max: float = DEFAULTS.backoff_max
    retry_after_max: float = DEFAULTS.retry_after_max
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def delay(self, failure: AttemptFailed, attempt: int) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None to give up."""
        if not failure.retryable or attempt > self.max_retries:
            return None
        if failure.retry_after is not None:
            return min(max(failure.retry_after, 0.0), self.retry_after_max)
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
        # "Equal jitter": at least half the ceiling, so waits still grow, but
        # clients that failed together do not all come back together.
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, or ``Retry-After``
    as delay-seconds or an HTTP date. None when absent or unreadable."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    import email.utils  # HTTP dates are rare; keep the import off the startup path

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date without a zone is GMT by definition
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def redact(text: str, secret: str | None) -> str:
    """Remove the API key, anything shaped like one and URL credentials from user-bound text."""
    return scrub(text, secret)


def advice(failure: AttemptFailed, timeout: float | None) -> str:
    """What the user can do about this failure: one sentence, without its final stop."""
    status = failure.status
    if failure.overflow is not None:
        window, prompt = failure.overflow
        size = f" ({prompt} tokens)" if prompt else ""
        limit = f" of {window} tokens" if window else ""
        return (f"the conversation{size} does not fit the model's context window{limit}: "
                "start a new conversation (--new), or use a model with a larger window")
    if failure.refused == "images":
        return ("the model does not take images: send the message without the image, or "
                "pick a model with vision (--model, CHATSTATE_MODEL)")
    if failure.refused == "files":
        return ("the model does not take file parts: attach text files as text (-a sends "
                "them so), or pick a model that reads documents (--model, CHATSTATE_MODEL)")
    if status == 401:
        return "check the API key (CHATSTATE_API_KEY or OPENAI_API_KEY)"
    if status == 403:
        return "check that the API key may use this model and project"
    if status == 404:
        return "check the model name (CHATSTATE_MODEL) and the base URL (CHATSTATE_BASE_URL)"
    if status == 429:
        return "the provider is rate limiting: wait or lower concurrency"
    if status is not None and status >= 500:
        return "the provider is failing: try again later"
    if status is not None:
        return ("the request was rejected and will be again as it is: check the messages, "
                "the model name (CHATSTATE_MODEL) and the parameters")
    if failure.kind == "timeout":
        return timeout_advice(timeout)
    if failure.kind == "connect":
        return "check the base URL and the network (is the server running?)"
    if failure.kind == "malformed":
        return ("the reply is not OpenAI-compatible: check the base URL, or a proxy "
                "in between")
    if failure.kind == "cut":
        return "the connection dropped mid-reply: try again"
    return "try again later"


def timeout_advice(timeout: float | None) -> str:
    limit = f" within {timeout:g}s" if timeout else ""
    return (f"the endpoint did not answer{limit}: if it is frozen, lower CHATSTATE_TIMEOUT "
            "(seconds per attempt) or CHATSTATE_MAX_RETRIES to fail sooner; if it is only "
            "slow, raise CHATSTATE_TIMEOUT")


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, whole up to ``limit`` characters, never cut inside a word or URL."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit]
    if flat[limit] != " " and " " in cut:
        cut = cut[:cut.rindex(" ")]  # back to the last whole word (a URL stays whole or goes)
    return cut.rstrip() + " …"


def sentence(text: str) -> str:
    """``text`` as a sentence: capitalised, ending with a full stop."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?…" else text + "."


def to_model_error(failure: AttemptFailed, *, attempts: int, endpoint: str,
                   secret: str | None, timeout: float | None,
                   shown_chars: int = 0) -> ModelError:
    """The ModelError for a failure that will not be retried (again)."""
    what = f"HTTP {failure.status}" if failure.status is not None else failure.detail
    provider = failure.provider_message
    if provider:
        provider = one_line(redact(provider, secret), MAX_PROVIDER_MESSAGE)
        what += f" ({provider})"
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    cut = (f"; the stream was cut after {shown_chars} characters"
           if shown_chars else "")
    what = what.rstrip(". ")  # an httpx2 or provider text may end with its own stop
    message = (f"model request to {endpoint} failed: {what}{tries}{cut}. "
               f"{sentence(advice(failure, timeout))}")
    return ModelError(
        redact(message, secret),
        status=failure.status,
        provider_message=provider,
        retryable=failure.retryable,
        overflow=failure.overflow,
        kind=failure.kind,
    )
