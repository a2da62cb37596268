"""Export and import of transcripts, and the renderings used by `replay`.

Two export forms:

- **chatstate** (``export_json``): the conversation as JSON with its hash-chained
  messages as stored, the partial reply apart, and every blob the messages name
  under ``"blobs"`` as a data URL keyed by its sha256. Importing it reproduces the
  same hashes and puts the blobs back into the store's blob area.
- **OpenAI messages** (``openai_messages``, as a JSON list or jsonl): what a
  chat-completions request would carry (content parts with blobs inlined as data
  URLs, ``tool_calls``, ``tool_call_id``, ``name``, and ``extra`` fields at the
  top level). Cut-off (partial) replies are left out, as the model never sees
  them. Importing it seals a new chain; parts above the blob threshold go back
  into the blob area, so export -> import -> export gives identical text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chatstate.core.content import blob_area, data_url, parse_data_url, store_parts
from chatstate.core.transcript import (
    Conversation,
    Message,
    brief,
    check_schema,
    new_id,
    new_turn_id,
    schema_for,
    validate_id,
    verify_chain,
)
from chatstate.errors import ChatstateError, CorruptTranscriptError, InvalidInput
from chatstate.ops.replay_text import message_lines
from chatstate.stores.base import Store
from chatstate.stores.blobs import blob_ref, checked_blob, named_blobs

ROLES = {"system", "user", "assistant", "tool"}
_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_FIELDS = ("tool_calls", "tool_call_id", "name")


@dataclass
class Imported:
    """A parsed import: the conversation, its sealed messages, and the blobs they name."""

    conversation: Conversation
    messages: list[Message]
    blobs: dict[str, tuple[bytes, str | None]] = field(default_factory=dict)


def _all(conv: Conversation) -> list[Message]:
    return conv.messages + ([conv.partial] if conv.partial is not None else [])


def to_document(conv: Conversation, *, export: bool = False,
                store: Store | None = None) -> dict[str, Any]:
    """As JSON. For replay the partial reply is a trailing message with status ``partial``;
    an export keeps it apart (``partial``) so an import restores it as the partial, and
    carries the named blobs (read from ``store``, digest checked) as data URLs."""
    messages = [m.stored() for m in conv.messages]
    partial = conv.partial.stored() if conv.partial is not None else None
    schema = schema_for(_all(conv))
    if export:
        doc = {"schema": schema, **conv.header(), "messages": messages, "partial": partial}
        named = named_blobs(_all(conv))
        if named:
            doc["schema"] = 2
            blobs = blob_area(store, f"the blobs conversation {conv.id!r} names")
            doc["blobs"] = {sha: data_url(blobs.get_blob(sha), _media(conv, sha))
                            for sha in named}
        return doc
    if partial is not None:
        messages.append(partial)
    return {"schema": schema, **conv.header(), "messages": messages}


def _media(conv: Conversation, sha: str) -> str:
    refs = [r for m in _all(conv) for r in m.blob_refs() if r.get("sha256") == sha]
    return str(refs[0].get("media_type") or "application/octet-stream")


def dumps(data: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """JSON that keeps non-ASCII text readable but escapes DEL, C1 and the bidi overrides.

    json.dumps already escapes C0 controls (ESC included); with ensure_ascii off it
    would pass U+007F-U+009F through raw, and some terminals act on C1 (U+009B is
    CSI), or the bidi overrides that reorder what is shown. These can only occur
    inside JSON strings, so escaped the document decodes to exactly the same data.
    """
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}",
                       json.dumps(data, ensure_ascii=False, indent=indent, sort_keys=sort_keys))


def export_json(conv: Conversation, store: Store | None = None) -> str:
    """The export file's text: the conversation, its hashes, any partial reply apart, and
    the blobs its messages name (``store`` is needed when they name any)."""
    return dumps(to_document(conv, export=True, store=store), indent=2) + "\n"


def write_export(path: Path, data: str) -> None:
    """``data`` written to the user's ``path``, atomically; a path that cannot take it
    is said so (the store's disk is not what is wrong), and nothing is written."""
    import os

    from chatstate.durable.files import atomic_write

    parent = path.parent
    if not parent.is_dir():
        raise InvalidInput(f"cannot export to {path}: the directory {parent} does not exist; "
                           "create it or give another path. Nothing was written.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(f"cannot export to {path}: the directory {parent} is not "
                           "writable by you; give another path. Nothing was written.")
    atomic_write(path, data.encode())


def openai_messages(conv: Conversation, store: Store | None = None) -> list[dict[str, Any]]:
    """The chain as chat-completions messages, blobs inlined (partial replies left out)."""
    from chatstate.core.content import inliner

    blob = inliner(store) if store is not None else None
    return [{**m.to_openai(blob=blob), **(m.extra or {})}
            for m in conv.messages if m.status != "partial"]


def export_openai(conv: Conversation, store: Store | None = None, *,
                  jsonl: bool = False) -> str:
    """Keys sorted: the sqlite store keeps a message's canonical JSON, so key order is not
    a property of the message, and the same transcript exports the same text anywhere."""
    messages = openai_messages(conv, store)
    if jsonl:
        return "".join(dumps(m, sort_keys=True) + "\n" for m in messages)
    return dumps(messages, indent=2, sort_keys=True) + "\n"


def render(conv: Conversation, fmt: str) -> str:
    """The conversation as text, markdown, json or jsonl (messages + partial)."""
    doc = to_document(conv)
    if fmt == "json":
        return dumps(doc, indent=2)
    if fmt == "jsonl":
        return "\n".join(dumps(m) for m in doc["messages"])
    head = [f"# {conv.title or conv.id}\n"] if fmt == "markdown" else []
    return "\n".join(head + message_lines(doc["messages"], fmt))


# -- import ---------------------------------------------------------------------------------


def read_import(path: Path) -> Imported:
    """Parse an export, an OpenAI messages list or jsonl; raise a clear error for anything else."""
    where = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{where}: cannot import: not readable ({exc})") from exc
    try:
        data = json.loads(raw)
    except ValueError:
        data = _jsonl(raw, where)
    if isinstance(data, dict) and "schema" in data:
        return _from_export(data, where)
    if isinstance(data, dict) and "role" in data:
        data = [data]  # jsonl of one message
    items = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items or not all(_is_message(m) for m in items):
        raise InvalidInput(f"{where}: cannot import: not a chatstate export and not an "
                           "OpenAI messages list ([{\"role\": \"user\", \"content\": "
                           "\"...\"}, ...]) or jsonl (one such message per line).")
    title = data.get("title", "") if isinstance(data, dict) else ""
    return _from_openai(items, str(title), where)


def _jsonl(raw: bytes, where: str) -> list[Any]:
    try:
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    except ValueError as exc:
        raise InvalidInput(f"{where}: cannot import: not readable JSON or jsonl ({exc}). "
                           "Expected a chatstate export or an OpenAI messages list.") from exc


def _is_message(item: Any) -> bool:
    if not isinstance(item, dict) or item.get("role") not in ROLES:
        return False
    content = item.get("content")
    return isinstance(content, (str, list)) or (content is None and "tool_calls" in item)


class _Collect:
    """A blob area that only collects (a ``BlobStore``): import parses before anything is
    written."""

    def __init__(self) -> None:
        self.blobs: dict[str, tuple[bytes, str | None]] = {}

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_ref(data, media_type, name)
        self.blobs[ref["sha256"]] = (data, media_type)
        return ref

    def get_blob(self, sha256: str) -> bytes:
        held = self.blobs.get(sha256)
        return checked_blob("the import's blobs", sha256, held[0] if held else None)

    def has_blob(self, sha256: str) -> bool:
        return sha256 in self.blobs


def _from_openai(items: list[dict[str, Any]], title: str, where: str) -> Imported:
    collect = _Collect()
    messages: list[Message] = []
    turn = new_turn_id()
    for index, item in enumerate(items):
        if item["role"] == "user":
            turn = new_turn_id()
        known = {k: item[k] for k in _FIELDS if item.get(k) is not None}
        extra = {k: v for k, v in item.items() if k not in ("role", "content", *_FIELDS)}
        try:
            content = store_parts(collect, item.get("content") or "")
            messages.append(Message.seal(messages[-1] if messages else None, role=item["role"],
                                         content=content, turn_id=turn, extra=extra or None,
                                         **known))
        except (ValidationError, ChatstateError) as exc:
            raise InvalidInput(f"{where}: cannot import message {index}: {brief(exc)}; "
                               "nothing was imported") from exc
    conv = Conversation(id=new_id("import"), title=title)
    return Imported(conv, messages, collect.blobs)


def _from_export(data: dict[str, Any], where: str) -> Imported:
    check_schema(data.get("schema"), where)
    try:
        conv = Conversation(id=validate_id(data.get("id")), title=data.get("title") or "",
                            created_at=data["created_at"], updated_at=data["updated_at"],
                            metadata=data.get("metadata") or {})
        messages = [Message.model_validate(m) for m in data.get("messages", [])]
        if data.get("partial"):
            conv.partial = Message.model_validate(data["partial"])
    except (KeyError, TypeError, ValueError, ValidationError) as exc:  # a bad id: ValueError
        raise CorruptTranscriptError(f"{where}: not a valid chatstate export ({brief(exc)})",
                                     where=where) from exc
    bad = verify_chain(messages)
    if bad is not None:
        raise CorruptTranscriptError(f"{where}: hash chain broken at seq {bad}; not imported",
                                     where=where, position=bad)
    named = messages + ([conv.partial] if conv.partial is not None else [])
    return Imported(conv, messages, _export_blobs(data, named, where))


def _export_blobs(data: dict[str, Any], messages: list[Message],
                  where: str) -> dict[str, tuple[bytes, str | None]]:
    carried = data.get("blobs") or {}
    out: dict[str, tuple[bytes, str | None]] = {}
    for sha in named_blobs(messages):
        url = carried.get(sha) if isinstance(carried, dict) else None
        raw = parse_data_url(url, f"{where} blob {sha}") if isinstance(url, str) else None
        out[sha] = (checked_blob(f"{where} blobs[{sha[:12]}…]", sha,
                                 raw[0] if raw else None), raw[1] if raw else None)
    return out


def import_into(store: Store, imported: Imported) -> None:
    """Write an import: blobs first (durable before the messages naming them), then the
    conversation, its messages and its partial. ConflictError if the id is taken."""
    if imported.blobs:
        blobs = blob_area(store, f"the {len(imported.blobs)} blob(s) of the import")
        for data, media_type in imported.blobs.values():
            blobs.put_blob(data, media_type=media_type)
    conv = imported.conversation
    store.create(conv)
    if imported.messages:
        store.append(conv.id, imported.messages)
    if conv.partial is not None:
        store.save_partial(conv.id, conv.partial)
