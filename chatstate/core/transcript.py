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

import json
import re
import secrets
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from itertools import repeat
from typing import Any, TypeVar

from chatstate.core.canonical import (
    canonical_json,
    canonical_pieces,
    chain_hash,
    chain_hash_pieces,
    long_text,
    well_formed,
)
from chatstate.core.fields import (
    MESSAGE_DEFAULTS,
    MESSAGE_FIELDS,
    MESSAGE_NAMES,
    OPTIONAL,
    OPTIONAL_FIELDS,
    REQUIRED,
    Content,
    Role,
    Status,
    Usage,
    plain_message,
    plain_messages,
)
from chatstate.core.provider_fields import PROVIDER_FIELDS
from chatstate.errors import CorruptTranscriptError, InvalidConversationId, SchemaVersionError

SCHEMA_VERSION = 2
"""The newest document schema this code reads. A document is written as schema 2 only
when it holds something 0.1 cannot read (see ``schema_for``); anything else is still
written as schema 1, so 0.1 keeps reading plain conversations, and refuses rich ones
with its "written by a newer chatstate" error instead of calling them damaged."""


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




def _copy(value: Any) -> Any:
    """A copy of the dicts and lists in ``value`` (what a pydantic dump hands back)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value



def _frozen(name: str, value: Any) -> Exception:
    """pydantic's error for setting a field of a frozen model, as it words it."""
    from pydantic_core import ValidationError

    return ValidationError.from_exception_data(
        "Message", [{"type": "frozen_instance", "loc": (name,), "input": value}])


_R = TypeVar("_R", bound="_Record")


class _Record:
    """What the record classes share: pydantic's model API over a plain ``__dict__``."""

    _NAMES: tuple[str, ...] = ()

    @classmethod
    def _pydantic(cls) -> Any:
        from chatstate.core import _models

        return _models.model(cls.__name__)

    @classmethod
    def _from_values(cls: type[_R], values: dict[str, Any]) -> _R:
        self = object.__new__(cls)
        object.__setattr__(self, "__dict__", values)
        return self

    @classmethod
    def _validated(cls: type[_R], data: Any) -> _R:
        """Through the pydantic model: coerced as pydantic would, or its ValidationError."""
        parsed = cls._pydantic().model_validate(data)
        return cls._from_values({k: getattr(parsed, k) for k in cls._NAMES})

    @classmethod
    def model_validate(cls: type[_R], obj: Any) -> _R:
        if isinstance(obj, cls):
            return obj
        if isinstance(obj, dict):
            return cls(**obj)
        return cls._validated(obj)

    @classmethod
    def model_validate_json(cls: type[_R], data: str | bytes) -> _R:
        try:
            obj = json.loads(data)
        except ValueError:
            return cls._validated_json(data)
        return cls.model_validate(obj) if isinstance(obj, dict) else cls._validated_json(data)

    @classmethod
    def _validated_json(cls: type[_R], data: str | bytes) -> _R:
        parsed = cls._pydantic().model_validate_json(data)
        return cls._from_values({k: getattr(parsed, k) for k in cls._NAMES})

    @classmethod
    def model_construct(cls: type[_R], **values: Any) -> _R:
        return cls._from_values({k: values[k] if k in values else cls._default(k)
                                 for k in cls._NAMES})

    @classmethod
    def _default(cls, name: str) -> Any:
        """A field's value when ``model_construct`` is not given it (None unless the
        record class says otherwise)."""
        return None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Inside other pydantic models and TypeAdapters: validated by the pydantic
        model of the same fields, handed back as this record class."""
        from pydantic_core import core_schema

        inner = handler.generate_schema(cls._pydantic())
        to_record = core_schema.no_info_after_validator_function(
            lambda m: cls._from_values({k: getattr(m, k) for k in cls._NAMES}), inner)
        return core_schema.no_info_before_validator_function(
            lambda v: v.model_dump() if isinstance(v, cls) else v, to_record,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda r: r.model_dump()))

    def model_dump(self, *, include: Any = None, exclude: Any = None,
                   exclude_none: bool = False, mode: str = "python",
                   by_alias: bool = False) -> dict[str, Any]:
        skip = set(exclude or ())
        out = {}
        for k in self._NAMES:
            v = getattr(self, k)
            if k in skip or (include is not None and k not in include) or \
                    (exclude_none and v is None):
                continue
            out[k] = v.model_dump() if isinstance(v, _Record) else (
                [m.model_dump() if isinstance(m, _Record) else _copy(m) for m in v]
                if isinstance(v, list) else _copy(v))
        return out

    def model_dump_json(self, **kwargs: Any) -> str:
        return json.dumps(self.model_dump(**kwargs), ensure_ascii=False,
                          separators=(",", ":"))

    def model_copy(self: _R, *, update: dict[str, Any] | None = None,
                   deep: bool = False) -> _R:
        values = _copy(self.__dict__) if deep else dict(self.__dict__)
        if update:
            values.update(update)
        return self._from_values(values)

    @property
    def model_fields_set(self) -> set[str]:
        return set(self.__dict__)

    def _values(self) -> list[tuple[str, Any]]:
        """Every field and its value, in the table's order (a record loaded from a store
        may leave fields at their defaults out of ``__dict__``)."""
        return [(k, getattr(self, k)) for k in self._NAMES]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(
            f"{k}={v!r}" for k, v in self._values()) + ")"

    def __repr_args__(self) -> list[tuple[str, Any]]:
        return self._values()


def _well_formed(content: Content) -> Content:
    """``content`` with its text (a string, or its text parts') ``well_formed``; the
    same object when nothing in it changes."""
    if isinstance(content, str):
        return well_formed(content)
    if not isinstance(content, list):
        return content
    out = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        made = well_formed(text) if isinstance(text, str) else text
        out.append(part if made is text else {**part, "text": made})
    return out if any(a is not b for a, b in zip(out, content, strict=True)) else content


class Message(_Record):
    """One message of a conversation; immutable once sealed into the chain.

    A plain record of the fields in ``MESSAGE_FIELDS`` (attributes, read only),
    checked by a fast structural test and, for anything that test does not pass, by
    the pydantic model of the same fields, which coerces or raises its ValidationError.
    """

    _NAMES = MESSAGE_NAMES
    model_fields = MESSAGE_FIELDS

    seq: int
    role: Role
    content: Content
    created_at: str
    turn_id: str
    status: Status
    model: str | None
    usage: Usage | None
    params: dict[str, Any] | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    name: str | None
    extra: dict[str, Any] | None
    finish_reason: str | None
    requested_model: str | None
    hash: str

    def __init__(self, **data: Any) -> None:
        if not plain_message(data):
            parsed = self._pydantic().model_validate(data)
            values = {k: getattr(parsed, k) for k in MESSAGE_NAMES}
        else:
            values = {k: _copy(data[k]) if k in data else MESSAGE_DEFAULTS[k]
                      for k in MESSAGE_NAMES}
        object.__setattr__(self, "__dict__", values)

    @classmethod
    def from_stored(cls, item: Any) -> Message | None:
        """A freshly parsed stored dict as a Message, without copying it; None when it
        is not plainly valid (then ``Message.model_validate`` decides)."""
        if type(item) is not dict or not plain_message(item):
            return None
        msg: Message = cls._from_values(item)  # a field left out reads its class default
        return msg

    @classmethod
    def from_stored_list(cls, items: list[Any], keys: set[str] | None = None
                         ) -> list[Message] | None:
        """``from_stored`` for each of ``items`` at once (each kept, not copied): None
        unless every one is plainly valid (``keys``: their ``message_keys``, if known).
        The records are made by C loops, not a Python call per message."""
        if not plain_messages(items, keys):
            return None
        return cls.records(items)

    @classmethod
    def records(cls, items: list[dict[str, Any]]) -> list[Message]:
        """Records over ``items``, kept as they are: only for dicts ``plain_free`` passed."""
        out: list[Message] = list(map(object.__new__, repeat(cls, len(items))))
        deque(map(object.__setattr__, out, repeat("__dict__"), items), maxlen=0)
        return out

    @classmethod
    def _default(cls, name: str) -> Any:
        return MESSAGE_DEFAULTS.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _frozen(name, value)

    def __delattr__(self, name: str) -> None:
        raise _frozen(name, None)

    def __hash__(self) -> int:
        return hash((self.seq, self.hash, self.turn_id))

    def body(self) -> str:
        """The canonical JSON that the hash covers."""
        return canonical_json({k: v for k, v in self._values()
                               if k != "hash" and not (v is None and k in OPTIONAL)})

    def body_pieces(self) -> Iterator[bytes]:
        """``body()`` as UTF-8 bytes, in pieces made as they are read: for a long text
        content (``long_text``) the head, the text's JSON a slice at a time and the tail,
        so the whole body is never built (a 50 MB reply is held once, as its text)."""
        return canonical_pieces({k: v for k, v in self._values()
                                 if k != "hash" and not (v is None and k in OPTIONAL)})

    def stored(self) -> dict[str, Any]:
        """The message as documents store it: the hashed body plus ``hash``, in the
        table's order."""
        return {k: _copy(v) for k, v in self._values() if not (v is None and k in OPTIONAL)}

    def needs_schema_2(self) -> bool:
        """Does this message hold anything a 0.1 reader would reject?"""
        return not isinstance(self.content, str) or self.status in ("error", "unknown") or \
            any(getattr(self, f) is not None for f in OPTIONAL_FIELDS)

    def expected_hash(self, prev_hash: str | None) -> str:
        if long_text(self.content):
            return chain_hash_pieces(prev_hash, self.body_pieces())
        return chain_hash(prev_hash, self.body())

    def hash_after(self, prev_hash: str | None, body: str) -> str:
        """``expected_hash(prev_hash)``, ``body`` being this message's ``body()``."""
        return chain_hash(prev_hash, body)

    @classmethod
    def seal(cls, prev: Message | None, *, role: Role, content: Content, turn_id: str,
             status: Status = "complete", model: str | None = None,
             usage: Usage | None = None, params: dict[str, Any] | None = None,
             created_at: str | None = None, **fields: Any) -> Message:
        """Build the next message after ``prev`` with its seq and chain hash filled in.

        ``fields`` are the OPTIONAL_FIELDS (``tool_calls``, ``tool_call_id``, ``name``,
        ``extra``, ``finish_reason``, ``requested_model``).
        """
        draft = cls(seq=0 if prev is None else prev.seq + 1, role=role,
                    content=_well_formed(content),
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


for _name, _value in MESSAGE_DEFAULTS.items():  # what a field left out of __dict__ reads
    setattr(Message, _name, _value)


SUMMARY_FIELDS: dict[str, tuple[Any, Any]] = {
    "id": (str, REQUIRED), "title": (str, REQUIRED), "created_at": (str, REQUIRED),
    "updated_at": (str, REQUIRED), "message_count": (int, REQUIRED)}


class ConversationSummary(_Record):
    _NAMES = tuple(SUMMARY_FIELDS)
    model_fields = SUMMARY_FIELDS

    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int

    def __init__(self, **data: Any) -> None:
        if data.keys() == SUMMARY_FIELDS.keys() and type(data["message_count"]) is int and \
                all(type(data[k]) is str for k in ("id", "title", "created_at", "updated_at")):
            values = {k: data[k] for k in self._NAMES}
        else:
            parsed = self._pydantic().model_validate(data)
            values = {k: getattr(parsed, k) for k in self._NAMES}
        object.__setattr__(self, "__dict__", values)


_NOW: Any = object()
"""The default of created_at and updated_at: the time the conversation is made."""
CONVERSATION_FIELDS: dict[str, tuple[Any, Any]] = {
    "id": (str, REQUIRED), "title": (str, ""), "created_at": (str, _NOW),
    "updated_at": (str, _NOW), "metadata": (dict[str, Any], dict),
    "messages": (list[Message], list), "partial": (Message | None, None)}
"""The fields of a conversation: name -> (type, default; a type as default is a factory)."""
_CONV_NAMES = tuple(CONVERSATION_FIELDS)


class Conversation(_Record):
    """A conversation as loaded from a store.

    ``messages`` is the hash-chained transcript. ``partial`` is the one
    in-progress reply a streaming writer saved (not part of the chain yet).
    """

    _NAMES = _CONV_NAMES
    model_fields = CONVERSATION_FIELDS

    id: str
    title: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any]
    messages: list[Message]
    partial: Message | None

    def __init__(self, **data: Any) -> None:
        messages = data.get("messages", ())
        partial = data.get("partial")
        if data.keys() <= CONVERSATION_FIELDS.keys() and "id" in data and \
                all(type(data.get(k, "")) is str
                    for k in ("id", "title", "created_at", "updated_at")) and \
                type(data.get("metadata", {})) is dict and \
                type(messages) in (list, tuple) and \
                all(type(m) is Message for m in messages) and \
                (partial is None or type(partial) is Message):
            values = {k: data[k] if k in data else self._default(k) for k in _CONV_NAMES}
            values["messages"] = list(messages)
            values["metadata"] = dict(values["metadata"])
        else:
            parsed = self._pydantic().model_validate(data)
            values = {k: getattr(parsed, k) for k in _CONV_NAMES}
        object.__setattr__(self, "__dict__", values)

    @classmethod
    def _default(cls, name: str) -> Any:
        default = CONVERSATION_FIELDS[name][1]
        if default is _NOW:
            return now_iso()
        return default() if isinstance(default, type) else default

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


def is_validation_error(exc: BaseException) -> bool:
    """Is ``exc`` pydantic's ValidationError? (Without importing pydantic: it can only be
    one if pydantic is loaded.)"""
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(exc, core.ValidationError)


def brief(exc: Exception) -> str:
    """One line saying what is wrong: pydantic's first error, not its multi-line report."""
    if is_validation_error(exc):
        errors = exc.errors()  # type: ignore[attr-defined]
        first = errors[0]
        field = ".".join(str(p) for p in first["loc"]) or "value"
        more = len(errors) - 1
        return f"{field}: {first['msg']}" + (f" (and {more} more)" if more else "")
    return " ".join(str(exc).split())[:200]


def parse_message(item: Any, where: str, position: int) -> Message:
    """Validate one stored message; a bad one is a CorruptTranscriptError naming its position."""
    try:
        return Message.model_validate(item)
    except ValueError as exc:  # pydantic's ValidationError
        if not is_validation_error(exc):
            raise
        raise CorruptTranscriptError(
            f"{where}: message at position {position} (seq {position}) is invalid "
            f"({brief(exc)}); it was left as it is.", where=where, position=position) from exc
