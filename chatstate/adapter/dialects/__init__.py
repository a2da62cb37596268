"""The wire APIs the adapter speaks, by the name the ``api`` setting gives them.

Each dialect is one module holding one ``Dialect`` (see ``base``): chat completions,
OpenAI Responses and Anthropic Messages. The setting is ``CHATSTATE_API`` (``--api``);
unset, the base URL decides (``api.anthropic.com`` speaks Anthropic Messages, a URL
ending in ``/responses`` or ``/messages`` names its API), else chat completions.
"""

from __future__ import annotations

from chatstate.adapter.dialects.anthropic_messages import ANTHROPIC_MESSAGES
from chatstate.adapter.dialects.base import Dialect
from chatstate.adapter.dialects.chat_completions import CHAT_COMPLETIONS
from chatstate.adapter.dialects.responses import RESPONSES

__all__ = ["DIALECTS", "Dialect", "dialect", "for_url"]

DIALECTS: dict[str, Dialect] = {d.name: d for d in (CHAT_COMPLETIONS, RESPONSES,
                                                    ANTHROPIC_MESSAGES)}
ALIASES = {"anthropic": "anthropic_messages", "messages": "anthropic_messages",
           "chat": "chat_completions", "openai_responses": "responses"}


def dialect(name: str) -> Dialect:
    """The dialect named ``name``; ValueError naming the known ones if there is none."""
    try:
        return DIALECTS[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown model api {name!r} in the model settings (CHATSTATE_API, "
                         f"--api); use one of: {', '.join(sorted(DIALECTS))}") from None


def for_url(base_url: str) -> tuple[str, str | None]:
    """(the base URL to use, the api it names or None): ``.../v1/responses`` is the
    Responses API at ``.../v1``, ``.../v1/messages`` Anthropic Messages, and
    ``api.anthropic.com`` speaks Anthropic Messages."""
    stripped = base_url.rstrip("/")
    for d in (RESPONSES, ANTHROPIC_MESSAGES, CHAT_COMPLETIONS):
        if stripped.endswith(d.path):
            return stripped[: -len(d.path)], d.name
    if "api.anthropic.com" in stripped:
        return base_url, ANTHROPIC_MESSAGES.name
    return base_url, None
