"""The transcript: conversations, messages and the hash chain that makes them checkable.

A message's ``hash`` is sha256 over the previous message's hash followed by the
message's canonical JSON (sorted keys, no whitespace, UTF-8, without ``hash``).
Truncation, reordering, insertion and edits all break the chain, and
``Conversation.verify()`` names the first position where it breaks.

Timestamps are kept as the exact ISO-8601 strings that were hashed, so a
round trip through any store can never change a hash.

From 0.2 a message holds everything a chat-completions conversation can
contain: content as a string or a list of parts (``text``, ``image_url``,
``file``, and kinds chatstate does not know, kept as they came), assistant
``tool_calls``, a ``tool`` message's ``tool_call_id``, and provider fields a
later request needs (in ``extra``). The fields added in 0.2 are left out of the
hashed body while they are unset, so a 0.1 message hashes exactly as before.

A large image or file is not kept inline: its part carries a ``blob``
reference (``{"sha256", "size", "media_type", "name"}``) to the store's
content-addressed blob area, and its data URL is left out. The reference is in
the hashed body, so the chain covers the blob's digest.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from chatstate.core.provider_fields import PROVIDER_FIELDS
from chatstate.errors import CorruptTranscriptError, InvalidConversationId, SchemaVersionError

SCHEMA_VERSION = 2
"""The newest document schema this code reads. A document is written as schema 2 only
when it holds something 0.1 cannot read (see ``schema_for``); anything else is still
written as schema 1, so 0.1 keeps reading plain conversations, and refuses rich ones
with its "written by a newer chatstate" error instead of calling them damaged."""

Role = Literal["system", "user", "assistant", "tool", "event"]
"""``event`` marks a change to what a framework's session shows (an SDK ``pop_item``, a
``clear_session``): it is recorded in the chain, never sent to a model."""
Status = Literal["complete", "partial", "error", "unknown"]
"""``complete`` and ``partial`` (a cut-off reply) for any message; a ``tool`` result is
``error`` when the tool raised (or the call was invalid) and ``unknown`` when a
non-idempotent tool was interrupted and may or may not have run."""

Content = str | list[dict[str, Any]]

# Added in 0.2: omitted from the hashed body while None, so old hashes stay valid.
OPTIONAL_FIELDS = ("tool_calls", "tool_call_id", "name", "extra", "finish_reason",
                   "requested_model")
# Token counts, with one level of detail ("prompt_tokens_details": {"cached_tokens": 3}).
Usage = dict[str, "int | dict[str, int]"]

_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def validate_id(conversation_id: object) -> str:
    """Return ``conversation_id`` if it is safe as a file name and object key, else raise."""
    if not isinstance(conversation_id, str):
        raise InvalidConversationId(
            f"conversation id must be a string, not {type(conversation_id).__name__}")
    if conversation_id in (".", "..") or not _ID_RE.fullmatch(conversation_id):
        shown = repr(conversation_id[:40]) + ("..." if len(conversation_id) > 40 else "")
        raise InvalidConversationId(
            f"invalid conversation id {shown} ({len(conversation_id)} chars): use 1-128 "
            "letters, digits, '-', '_' or '.', and not '.' or '..'")
    return conversation_id


def new_id(prefix: str = "c") -> str:
    """A fresh conversation id: sortable by creation time, unguessable suffix."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(4)}"


def new_turn_id() -> str:
    return "t-" + secrets.token_hex(8)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def canonical_json(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


HASH_SLICE = 1 << 20
"""Characters of a body encoded at a time to be hashed."""


def chain_hash(prev_hash: str | None, body: str) -> str:
    h = hashlib.sha256()
    h.update((prev_hash or "").encode())
    # in slices: a long reply's body is not copied whole once more to be hashed (each code
    # point encodes on its own, so the slices' bytes are the whole body's)
    for at in range(0, len(body), HASH_SLICE):
        h.update(body[at:at + HASH_SLICE].encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class Message(BaseModel):
    """One message of a conversation; immutable once sealed into the chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(ge=0)
    role: Role
    content: Content
    created_at: str
    turn_id: str
    status: Status = "complete"
    model: str | None = None
    usage: Usage | None = None
    params: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """Assistant tool calls as chat-completions sends them:
    ``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments the raw
    JSON string, kept byte for byte."""
    tool_call_id: str | None = None
    """On a ``tool`` message: the call it answers."""
    name: str | None = None
    extra: dict[str, Any] | None = None
    """Other fields the provider returned that a later request needs (``refusal``,
    ``reasoning``, ...), kept as they came."""
    finish_reason: str | None = None
    """Why the model stopped, when it was not a normal stop ("length", "content_filter")."""
    requested_model: str | None = None
    """The model the request named, when the server reported a different one in ``model``."""
    hash: str = ""

    @field_validator("content")
    @classmethod
    def _parts_are_typed(cls, value: Content) -> Content:
        if isinstance(value, list):
            for i, part in enumerate(value):
                if not isinstance(part.get("type"), str):
                    raise ValueError(f"content part {i} has no string 'type'")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _calls_have_ids(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, call in enumerate(value or ()):
            function = call.get("function")
            if not isinstance(call.get("id"), str) or not isinstance(function, dict) or \
                    not isinstance(function.get("name"), str) or \
                    not isinstance(function.get("arguments"), str):
                raise ValueError(f"tool call {i} needs a string 'id' and a 'function' with "
                                 "string 'name' and 'arguments'")
        return value

    def body(self) -> str:
        """The canonical JSON that the hash covers."""
        unset = {f for f in OPTIONAL_FIELDS if getattr(self, f) is None}
        return canonical_json(self.model_dump(exclude={"hash", *unset}))

    def stored(self) -> dict[str, Any]:
        """The message as documents store it: the hashed body plus ``hash``."""
        unset = {f for f in OPTIONAL_FIELDS if getattr(self, f) is None}
        return self.model_dump(exclude=unset)

    def needs_schema_2(self) -> bool:
        """Does this message hold anything a 0.1 reader would reject?"""
        return not isinstance(self.content, str) or self.status in ("error", "unknown") or \
            any(getattr(self, f) is not None for f in OPTIONAL_FIELDS)

    def expected_hash(self, prev_hash: str | None) -> str:
        return chain_hash(prev_hash, self.body())

    @classmethod
    def seal(cls, prev: Message | None, *, role: Role, content: Content, turn_id: str,
             status: Status = "complete", model: str | None = None,
             usage: Usage | None = None, params: dict[str, Any] | None = None,
             created_at: str | None = None, **fields: Any) -> Message:
        """Build the next message after ``prev`` with its seq and chain hash filled in.

        ``fields`` are the OPTIONAL_FIELDS (``tool_calls``, ``tool_call_id``, ``name``,
        ``extra``, ``finish_reason``, ``requested_model``).
        """
        draft = cls(seq=0 if prev is None else prev.seq + 1, role=role, content=content,
                    created_at=created_at or now_iso(), turn_id=turn_id, status=status,
                    model=model, usage=usage, params=params, **fields)
        return draft.model_copy(update={"hash": draft.expected_hash(prev.hash if prev else None)})

    @property
    def text(self) -> str:
        """The text of the message: the content string, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")

    def blob_refs(self) -> list[dict[str, Any]]:
        """The blob references this message names (each ``{"sha256", "size", ...}``)."""
        if isinstance(self.content, str):
            return []
        return [p["blob"] for p in self.content if isinstance(p.get("blob"), dict)]

    def to_openai(self, blob: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                  *, provider: bool = False) -> dict[str, Any]:
        """The chat-completions request form of this message.

        ``blob`` turns a part that carries a blob reference into the part to send
        (the data inlined as a data URL); it is required when the message names blobs.
        ``provider`` adds the message's provider fields (``extra``: signed thinking
        blocks, reasoning items) under ``PROVIDER_FIELDS``, for the adapter's dialect
        to send back what its API can express (and leave out the rest).
        """
        content: Any = self.content
        if isinstance(content, list):
            if blob is None and self.blob_refs():
                raise ValueError(f"message seq {self.seq} names blobs: pass blob= to inline them")
            content = [blob(p) if blob is not None and "blob" in p else p for p in content]
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
            if content == "":
                out["content"] = None
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if provider and self.extra:
            out[PROVIDER_FIELDS] = dict(self.extra)
        return out


class ConversationSummary(BaseModel):
    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int


class Conversation(BaseModel):
    """A conversation as loaded from a store.

    ``messages`` is the hash-chained transcript. ``partial`` is the one
    in-progress reply a streaming writer saved (not part of the chain yet).
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    title: str = ""
    created_at: str = Field(default_factory=now_iso)
    updated_at: str = Field(default_factory=now_iso)
    metadata: dict[str, Any] = Field(default_factory=dict)
    messages: list[Message] = Field(default_factory=list)
    partial: Message | None = None

    @property
    def last(self) -> Message | None:
        return self.messages[-1] if self.messages else None

    @property
    def last_seq(self) -> int:
        return self.messages[-1].seq if self.messages else -1

    def verify(self) -> int | None:
        """Return the seq position of the first message that breaks the chain, or None."""
        return verify_chain(self.messages)

    def summary(self) -> ConversationSummary:
        return ConversationSummary(id=self.id, title=self.title, created_at=self.created_at,
                                   updated_at=self.updated_at, message_count=len(self.messages))

    def header(self) -> dict[str, Any]:
        """The conversation's fields without messages, as stored."""
        return {"id": self.id, "title": self.title, "created_at": self.created_at,
                "updated_at": self.updated_at, "metadata": self.metadata}


def verify_chain(messages: list[Message], prev_hash: str | None = None,
                 start_seq: int = 0) -> int | None:
    """First position (index from ``start_seq``) where seq or hash is wrong, else None."""
    for offset, msg in enumerate(messages):
        position = start_seq + offset
        if msg.seq != position or msg.hash != msg.expected_hash(prev_hash):
            return position
        prev_hash = msg.hash
    return None


def schema_for(messages: Iterable[Message | None]) -> int:
    """The schema to write a document holding ``messages`` with (1 unless 0.2 fields are used)."""
    return 2 if any(m is not None and m.needs_schema_2() for m in messages) else 1


def check_schema(version: object, where: str) -> None:
    """Refuse documents from a newer chatstate rather than guess at them."""
    if not isinstance(version, int):
        raise SchemaVersionError(f"{where}: missing or invalid schema version {version!r}",
                                 where=where)
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: written by a newer chatstate (schema {version}, this one reads up to "
            f"{SCHEMA_VERSION}); upgrade chatstate to read it. The file was not changed.",
            where=where)


def brief(exc: Exception) -> str:
    """One line saying what is wrong: pydantic's first error, not its multi-line report."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "value"
        more = len(exc.errors()) - 1
        return f"{field}: {first['msg']}" + (f" (and {more} more)" if more else "")
    return " ".join(str(exc).split())[:200]


def parse_message(item: Any, where: str, position: int) -> Message:
    """Validate one stored message; a bad one is a CorruptTranscriptError naming its position."""
    try:
        return Message.model_validate(item)
    except ValidationError as exc:
        raise CorruptTranscriptError(
            f"{where}: message at position {position} (seq {position}) is invalid "
            f"({brief(exc)}); it was left as it is.", where=where, position=position) from exc
