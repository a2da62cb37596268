"""Which stored conversation a proxied request continues, and what in it is new.

Clients of the OpenAI API send the whole history with every request. The proxy
keeps one conversation per history: when the stored transcript (less cut-off
replies, which the model never sees) is a prefix of the incoming messages, only
the rest is appended; when they diverge (an edited or regenerated turn), the
request continues in a new conversation forked at the divergence.

Without an explicit id, the conversation is found by the history itself: each
stored conversation is indexed by a digest of its visible messages, and a
request continues the conversation whose digest matches its longest prefix.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatstate.core.transcript import Conversation, Message, canonical_json

# Message fields that a later request needs; the rest of a wire message goes to ``extra``.
WIRE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")
ROLES = ("system", "developer", "user", "assistant", "tool")


def wire_form(message: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a chat-completions message that identifies it, for comparing histories."""
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def stored_form(message: Message) -> dict[str, Any]:
    """A stored message in wire form. A part kept in the blob area stays a reference (the
    proxy stores what clients send inline, so only a conversation written by ``Chat``
    with a large attachment holds one; a client's inline copy then differs: a fork)."""
    role = (message.extra or {}).get("role", message.role)  # "developer" is kept in extra
    return wire_form({**message.to_openai(blob=lambda part: part), "role": role})


def visible(conv: Conversation) -> list[Message]:
    """What a client's history holds of a conversation: cut-off replies left out."""
    return [m for m in conv.messages if m.status != "partial" and m.role != "event"]


def _step(digest: str, message: Mapping[str, Any]) -> str:
    return hashlib.sha256((digest + canonical_json(dict(message))).encode("utf-8",
                                                                    "surrogatepass")).hexdigest()


def history_digest(forms: Sequence[Mapping[str, Any]]) -> str:
    digest = ""
    for form in forms:
        digest = _step(digest, form)
    return digest


class HistoryIndex:
    """Digest of each conversation's visible history -> its id (newest wins)."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, conv: Conversation) -> None:
        forms = [stored_form(m) for m in visible(conv)]
        if forms:
            with self._lock:
                self._ids[history_digest(forms)] = conv.id

    def find(self, incoming: Sequence[Mapping[str, Any]]) -> str | None:
        """The conversation whose history is the longest proper prefix of ``incoming``."""
        digests, digest = [], ""
        for message in incoming[:-1]:
            digest = _step(digest, wire_form(message))
            digests.append(digest)
        with self._lock:
            for digest in reversed(digests):
                if digest in self._ids:
                    return self._ids[digest]
        return None


@dataclass
class Plan:
    """What to write for one request: the new messages and where they go."""

    conversation_id: str
    new: list[dict[str, Any]]
    """Incoming messages that are not stored yet (the last one is the request's)."""
    stored: Conversation | None = None
    """The conversation continued, as loaded (None: a new one)."""
    fork_of: Conversation | None = None
    common: int = 0
    """With ``fork_of``: how many of its visible messages the fork starts with."""


def reconcile(conv: Conversation | None, conversation_id: str, fork_id: str,
              incoming: Sequence[Mapping[str, Any]]) -> Plan:
    """Continue ``conv`` when its visible history is a prefix of ``incoming``, else fork."""
    if conv is None:
        return Plan(conversation_id, [dict(m) for m in incoming])
    stored = [stored_form(m) for m in visible(conv)]
    common = 0
    for have, got in zip(stored, incoming, strict=False):
        if have != wire_form(got):
            break
        common += 1
    if common == len(stored) and len(incoming) > common:
        return Plan(conv.id, [dict(m) for m in incoming[common:]], stored=conv)
    if common == len(stored) == len(incoming) and stored and stored[-1]["role"] != "assistant":
        return Plan(conv.id, [], stored=conv)  # the same request again: answer that turn
    return Plan(fork_id, [dict(m) for m in incoming[common:]], fork_of=conv, common=common)


def message_fields(message: Mapping[str, Any]) -> dict[str, Any]:
    """A wire message as ``Message.seal`` keywords; fields beyond the known ones go to extra."""
    role = message.get("role")
    extra = {k: v for k, v in message.items() if k not in WIRE_FIELDS}
    if role == "developer":
        extra["role"], role = "developer", "system"
    content = message.get("content")
    fields: dict[str, Any] = {"role": role, "content": "" if content is None else content}
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key) is not None:
            fields[key] = message[key]
    if extra:
        fields["extra"] = extra
    return fields
