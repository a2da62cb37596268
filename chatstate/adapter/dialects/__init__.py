"""The wire APIs the adapter speaks, by the name the ``api`` setting gives them.

Each dialect is one module holding one ``Dialect`` (see ``base``); today only
chat completions.
"""

from __future__ import annotations

from chatstate.adapter.dialects.base import Dialect
from chatstate.adapter.dialects.chat_completions import CHAT_COMPLETIONS

__all__ = ["DIALECTS", "Dialect", "dialect"]

DIALECTS: dict[str, Dialect] = {d.name: d for d in (CHAT_COMPLETIONS,)}


def dialect(name: str) -> Dialect:
    """The dialect named ``name``; ValueError naming the known ones if there is none."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown model api {name!r} in the model settings (api=); "
                         f"use one of: {', '.join(sorted(DIALECTS))}") from None
