"""The stateless model adapter: whole message list in, reply out, retries inside.

    adapter = make_adapter()                       # httpx2 wire client, settings from env
    adapter = make_adapter(client=openai.OpenAI()) # the caller's SDK client
    adapter.complete(messages)  -> Completion
    adapter.stream(messages)    -> str deltas ..., then one Completion

The wire API is a dialect (``dialects/``: chat completions, chosen by the
``api`` setting); the client that sends it is a backend (``backends/``: httpx2
wire or the openai SDK); one retry loop (``base``) drives both.

Importing this package is cheap: httpx2 and openai load only when an adapter
is made (openai only for an SDK client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chatstate.adapter._policy import AttemptFailed, RetryPolicy
from chatstate.adapter.base import Backend, Completion, ModelAdapter, RetryingAdapter

if TYPE_CHECKING:
    from chatstate.adapter.dialects.base import Dialect
    from chatstate.adapter.settings import ModelSettings

__all__ = [
    "AttemptFailed",
    "Backend",
    "Completion",
    "ModelAdapter",
    "ModelSettings",
    "RetryPolicy",
    "RetryingAdapter",
    "make_adapter",
]


def __getattr__(name: str) -> Any:
    # ModelSettings builds a pydantic model; load it on first use only.
    if name == "ModelSettings":
        from chatstate.adapter.settings import ModelSettings

        return ModelSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_adapter(*, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, client: Any = None, timeout: float | None = None,
                 max_retries: int | None = None, backoff_base: float | None = None,
                 settings: ModelSettings | None = None, api: str | None = None
                 ) -> RetryingAdapter:
    """Build an adapter. Arguments win over ``settings`` (default: ``ModelSettings()``,
    i.e. CHATSTATE_* env > OPENAI_* env > .env).

    ``client`` = an ``openai.OpenAI`` instance -> the SDK backend (openai is
    imported only then; its own retries are switched off); otherwise the
    httpx2 wire backend talks to ``base_url``. ``base_url``/``api_key`` with a
    ``client`` is an error: the client already carries both.

    ``api`` (else ``CHATSTATE_API``) picks the dialect: ``chat_completions`` (the
    default), ``responses`` or ``anthropic_messages``; unset, a base URL ending in an
    API's path (``.../v1/messages``) or naming api.anthropic.com picks it.
    """
    from chatstate.adapter._env import Secret, resolve
    from chatstate.adapter.dialects import dialect, for_url

    given: dict[str, Any] = {"model": model, "base_url": base_url,
                             "api_key": Secret(api_key) if api_key is not None else None,
                             "timeout": timeout, "max_retries": max_retries,
                             "backoff_base": backoff_base, "api": api}
    overrides = {k: v for k, v in given.items() if v is not None}
    if settings is None:
        settings = resolve(overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    url, named = for_url(settings.base_url)
    if url != settings.base_url or (named and "api" not in settings.model_fields_set):
        update = {"base_url": url, **({"api": named} if named and "api" not in
                                      settings.model_fields_set else {})}
        settings = settings.model_copy(update=update) if hasattr(settings, "model_copy") \
            else _replace(settings, update)
    policy = RetryPolicy(max_retries=settings.max_retries, backoff_base=settings.backoff_base,
                         backoff_max=settings.backoff_max,
                         retry_after_max=settings.retry_after_max)
    backend = _backend(settings, client, dialect(settings.api),
                       explicit_timeout=timeout is not None
                       or "timeout" in settings.model_fields_set,
                       conflicting=base_url is not None or api_key is not None)
    return RetryingAdapter(backend, model=settings.model, policy=policy)


def _replace(settings: Any, update: dict[str, Any]) -> Any:
    import dataclasses

    return dataclasses.replace(settings, **update)


def _warn_if_key_looks_wrong(key: str | None, base_url: str) -> None:
    """A key too short to be real is a typo or a placeholder; a local server takes any."""
    from urllib.parse import urlsplit

    from chatstate.core.redact import MIN_SECRET, looks_too_short, redact_url

    host = (urlsplit(base_url).hostname or "").lower()
    if looks_too_short(key) and host not in ("localhost", "127.0.0.1", "::1"):
        import logging

        logging.getLogger("chatstate.adapter").warning(
            "the API key for %s is shorter than %d characters, which no provider issues: "
            "check CHATSTATE_API_KEY / OPENAI_API_KEY (a key this short is not hidden from "
            "messages)", redact_url(base_url), MIN_SECRET)


def _backend(settings: Any, client: Any, api: Dialect, *, explicit_timeout: bool,
             conflicting: bool) -> Backend:
    if client is None:
        from chatstate.adapter.backends.wire import WireBackend

        key = settings.api_key.get_secret_value() if settings.api_key else None
        if key is None and "api.openai.com" in settings.base_url:
            from chatstate.errors import ModelError

            raise ModelError(
                f"no API key for {settings.base_url}: set OPENAI_API_KEY (or "
                "CHATSTATE_API_KEY, or put it in .env), point CHATSTATE_BASE_URL at a local "
                "OpenAI-compatible server, or try chatstate offline with --model fake")
        _warn_if_key_looks_wrong(key, settings.base_url)
        return WireBackend(settings.base_url, key, timeout=settings.timeout,
                           connect_timeout=settings.connect_timeout, dialect=api)
    import openai

    from chatstate.adapter.backends.sdk import SdkBackend

    if not isinstance(client, openai.OpenAI):
        raise TypeError(f"client must be an openai.OpenAI instance, not {type(client).__name__}")
    if conflicting:
        raise ValueError("pass base_url/api_key to the openai.OpenAI client, not with client=")
    # The caller's client keeps its own timeout unless one was configured here.
    return SdkBackend(client, timeout=settings.timeout if explicit_timeout else None,
                      connect_timeout=settings.connect_timeout, dialect=api)
