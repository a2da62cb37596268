"""Which stored conversation a proxied request continues, and what in it is new.

Clients of the OpenAI API send the whole history with every request. The proxy
keeps one conversation per history: when the stored transcript (less cut-off
replies, which the model never sees) is a prefix of the incoming messages, only
the rest is appended; when they diverge (an edited or regenerated turn), the
request continues in a new conversation forked at the divergence.

Without an explicit id, the conversation is found by the history itself: each
stored conversation is indexed by a digest of its visible messages, per namespace
(``_auth``), and a request continues the conversation whose digest matches its
longest prefix, but only when exactly one does: two conversations with the same
history (two users who asked the same question at temperature 0) are never merged
by a guess, the request starts a new one that records what it matched.

Tool-call arguments are compared as parsed JSON: clients (LangChain, llm,
pydantic-ai) send back the arguments they received re-serialised.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatstate.core.canonical import canonical_pieces
from chatstate.core.transcript import Conversation, Message
from chatstate.serve._request_record import key_of

# Message fields that a later request needs; the rest of a wire message goes to ``extra``.
WIRE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")
ROLES = ("system", "developer", "user", "assistant", "tool")


def wire_form(message: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a chat-completions message that identifies it, for comparing histories."""
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_call_form(call) for call in out["tool_calls"]]
    return out


def _call_form(call: Any) -> Any:
    """A tool call with its arguments parsed (when they are JSON), so that ``{"a":1}``
    and ``{"a": 1}`` are the same call."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": {"json": arguments}}}


def stored_form(message: Message) -> dict[str, Any]:
    """A stored message in wire form. A part kept in the blob area stays a reference (the
    proxy stores what clients send inline, so only a conversation written by ``Chat``
    with a large attachment holds one; a client's inline copy then differs: a fork)."""
    role = (message.extra or {}).get("role", message.role)  # "developer" is kept in extra
    return wire_form({**message.to_openai(blob=lambda part: part), "role": role})


def shown(message: Message) -> bool:
    """Whether a client's history holds this stored message (cut-off replies and events
    it does not)."""
    return message.status != "partial" and message.role != "event"


def visible(conv: Conversation) -> list[Message]:
    """What a client's history holds of a conversation: cut-off replies left out."""
    return [m for m in conv.messages if shown(m)]


def _step(digest: str, message: Mapping[str, Any]) -> str:
    h = hashlib.sha256(digest.encode())
    for piece in canonical_pieces(dict(message)):  # a long reply is not copied whole again
        h.update(piece)
    return h.hexdigest()


def history_digest(forms: Sequence[Mapping[str, Any]], digest: str = "") -> str:
    """The digest of a history (``digest``: that of the history before ``forms``)."""
    for form in forms:
        digest = _step(digest, form)
    return digest


def namespace_of(conv: Conversation) -> str:
    """The namespace a conversation belongs to ("" for the default one)."""
    namespace = conv.metadata.get("namespace", "")
    return namespace if isinstance(namespace, str) else ""


class Ambiguous(Exception):
    """More than one conversation of the namespace has the request's history."""

    def __init__(self, matched: list[str]) -> None:
        super().__init__(f"the history matches {len(matched)} conversations")
        self.matched = matched


class HistoryIndex:
    """Per namespace: the digest of each conversation's visible history -> its ids; the
    fork each conversation was last followed by; each request key's (id, turn id)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], list[str]] = {}
        self._namespaces: dict[str, str] = {}
        self._follows: dict[str, tuple[str, str]] = {}  # source -> (created_at, fork id)
        self._requests: dict[tuple[str, str], tuple[str, str]] = {}
        # conversation id -> (messages digested, the last one's chain hash, the digest of
        # the visible ones among them): a turn's add digests its new messages only
        self._digested: dict[str, tuple[int, str | None, str]] = {}
        self._lock = threading.Lock()

    def add(self, conv: Conversation) -> None:
        namespace = namespace_of(conv)
        count, digest = self._digest(conv)
        source = (conv.metadata.get("forked_from") or {}).get("id")
        with self._lock:
            self._namespaces[conv.id] = namespace
            self._digested[conv.id] = (count, conv.messages[count - 1].hash if count else None,
                                       digest)
            if digest:
                ids = self._ids.setdefault((namespace, digest), [])
                if conv.id not in ids:
                    ids.append(conv.id)
            if isinstance(source, str) and (source not in self._follows or
                                            self._follows[source] < (conv.created_at, conv.id)):
                self._follows[source] = (conv.created_at, conv.id)
            for m in conv.messages:
                key = key_of(m.params)
                if isinstance(key, str) and (source is None  # a fork's copies: its source's
                                             or (namespace, key) not in self._requests):
                    self._requests[(namespace, key)] = (conv.id, m.turn_id)

    def _digest(self, conv: Conversation) -> tuple[int, str]:
        """(messages digested, ``history_digest`` of the visible ones), carried on from
        the last add of this conversation when its messages still begin with those (the
        chain hash of the last one digested is the same, and it covers all before it), so
        a long conversation, or a long reply, is not digested again at every turn."""
        messages = conv.messages
        with self._lock:
            start, last, digest = self._digested.get(conv.id, (0, None, ""))
        if start > len(messages) or (start and messages[start - 1].hash != last):
            start, digest = 0, ""  # rewritten meanwhile (a rekey, another writer)
        return len(messages), history_digest(
            [stored_form(m) for m in messages[start:] if shown(m)], digest)

    def forget(self, conversation_id: str) -> None:
        with self._lock:
            self._namespaces.pop(conversation_id, None)
            self._digested.pop(conversation_id, None)
            for ids in self._ids.values():
                if conversation_id in ids:
                    ids.remove(conversation_id)
            for key, (cid, _) in list(self._requests.items()):
                if cid == conversation_id:
                    del self._requests[key]
            for source, (_, fork) in list(self._follows.items()):
                if conversation_id in (source, fork):
                    del self._follows[source]

    def namespace(self, conversation_id: str) -> str | None:
        """The namespace of an indexed conversation; None: not indexed (yet)."""
        return self._namespaces.get(conversation_id)

    def note(self, namespace: str, conv: Conversation) -> None:
        """Remember a conversation's namespace before its first reply is committed."""
        with self._lock:
            self._namespaces.setdefault(conv.id, namespace)

    def find(self, namespace: str, incoming: Sequence[Mapping[str, Any]]) -> str | None:
        """The conversation whose history is the longest proper prefix of ``incoming``, or
        all of it when that is a stored turn still unanswered (``retried``); Ambiguous when
        more than one conversation has that history."""
        digests, digest = [], ""
        for message in incoming if retried(incoming) else incoming[:-1]:
            digest = _step(digest, wire_form(message))
            digests.append(digest)
        with self._lock:
            for digest in reversed(digests):
                ids = self._ids.get((namespace, digest))
                if ids and len(ids) > 1:
                    raise Ambiguous(list(ids))
                if ids:
                    return ids[0]
        return None

    def follower(self, conversation_id: str) -> str | None:
        """The newest fork of a conversation (a fixed id follows it)."""
        found = self._follows.get(conversation_id)
        return found[1] if found else None

    def request(self, namespace: str, key: str) -> tuple[str, str] | None:
        """(conversation id, turn id) a request key was stored under."""
        return self._requests.get((namespace, key))

    def remember_request(self, namespace: str, key: str, conversation_id: str,
                         turn_id: str) -> None:
        with self._lock:
            self._requests[(namespace, key)] = (conversation_id, turn_id)


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
    matched: list[str] = field(default_factory=list)
    """A new conversation's history matched these (more than one): none was guessed."""


def retried(incoming: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a conversation holding all of ``incoming`` would hold it as a turn still
    unanswered, sent again: a history (it has a reply in it) whose last message asks
    (a user message or a tool's output). A client that retries it after the proxy was
    killed rebuilds it from what the proxy sent, so the body (and the request key) can
    differ from the first attempt's while the messages are the same: it answers that
    turn instead of starting a conversation that repeats the history. A first question
    is never matched so: two clients may ask the same one."""
    return len(incoming) > 1 and incoming[-1].get("role") in ("user", "tool") and \
        any(m.get("role") == "assistant" for m in incoming[:-1])


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
