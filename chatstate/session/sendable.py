"""What of a transcript goes to the model, and what of a request is stored.

The transcript keeps everything; the model is sent only what makes a valid
chat: complete messages of turns that were answered, plus the turn being
answered now. A cut-off (partial) reply is never passed off as the model's
final words, and the user message of an earlier turn that got no reply is left
out, because it would put two user messages in a row, which strict chat
templates (Mistral, Gemma under llama.cpp's jinja engine) reject with HTTP 400.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chatstate.core.redact import scrub
from chatstate.core.transcript import Message

__all__ = ["CONTINUE_PROMPT", "CUT_REASONS", "sendable", "storable"]

CONTINUE_PROMPT = "Continue exactly where your previous reply stopped."
"""The message of the turn that asks the model to go on with a reply it cut short."""
CUT_REASONS = {"length": "the reply was cut at the token limit",
               "content_filter": "the reply was stopped by the provider's content filter"}
"""finish_reason values that end a reply early, and how to say so."""


def sendable(messages: Sequence[Message], turn_id: str,
             blob: Callable[[dict[str, Any]], dict[str, Any]] | None = None
             ) -> tuple[list[dict[str, Any]], list[int]]:
    """(the history to send for ``turn_id``, the seqs of unanswered user messages left out).

    ``blob`` inlines the images and files kept in the store's blob area (see
    ``Message.to_openai``)."""
    kept = [m for m in messages if m.status != "partial"]
    answered = {m.turn_id for m in kept if m.role == "assistant"} | {turn_id}
    left_out = [m.seq for m in kept if m.role == "user" and m.turn_id not in answered]
    return ([m.to_openai(blob=blob) for m in kept if m.role != "user" or m.turn_id in answered],
            left_out)


def storable(value: Any) -> Any:
    """Request params as they may be stored: no credentials (a URL's user:password, a key)."""
    if isinstance(value, str):
        return scrub(value, limit=None)
    if isinstance(value, dict):
        return {k: storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value
