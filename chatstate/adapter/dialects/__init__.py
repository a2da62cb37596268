"""The wire APIs the adapter speaks, by the name the ``api`` setting gives them.

Each dialect is one module holding one ``Dialect`` (see ``base``): chat completions,
OpenAI Responses and Anthropic Messages. The setting is ``CHATSTATE_API`` (``--api``);
unset, the base URL decides (``api.anthropic.com`` speaks Anthropic Messages, a URL
ending in ``/responses`` or ``/messages`` names its API), else chat completions.
"""

from __future__ import annotations

import importlib
from typing import Any

from chatstate.adapter.dialects.base import Dialect

__all__ = ["DIALECTS", "Dialect", "dialect", "for_url"]

# name -> (module, the Dialect's name in it, the path it posts to), imported on first use:
# a turn loads the one dialect it speaks (tests/adapter/test_dialects.py holds the paths
# to each dialect's own ``path``)
REGISTRY = {
    "chat_completions": ("chat_completions", "CHAT_COMPLETIONS", "/chat/completions"),
    "responses": ("responses", "RESPONSES", "/responses"),
    "anthropic_messages": ("anthropic_messages", "ANTHROPIC_MESSAGES", "/messages"),
}
ALIASES = {"anthropic": "anthropic_messages", "messages": "anthropic_messages",
           "chat": "chat_completions", "openai_responses": "responses"}


def dialect(name: str) -> Dialect:
    """The dialect named ``name``; ValueError naming the known ones if there is none."""
    try:
        module, attribute, _ = REGISTRY[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown model api {name!r} in the model settings (CHATSTATE_API, "
                         f"--api); use one of: {', '.join(sorted(REGISTRY))}") from None
    found: Dialect = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    return found


def __getattr__(name: str) -> Any:
    if name == "DIALECTS":  # every dialect, by name (imports them all)
        return {n: dialect(n) for n in REGISTRY}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def for_url(base_url: str) -> tuple[str, str | None]:
    """(the base URL to use, the api it names or None): ``.../v1/responses`` is the
    Responses API at ``.../v1``, ``.../v1/messages`` Anthropic Messages, and
    ``api.anthropic.com`` speaks Anthropic Messages."""
    stripped = base_url.rstrip("/")
    for name in ("responses", "anthropic_messages", "chat_completions"):
        path = REGISTRY[name][2]
        if stripped.endswith(path):
            return stripped[: -len(path)], name
    if "api.anthropic.com" in stripped:
        return base_url, "anthropic_messages"
    return base_url, None
