"""Export and import of transcripts, and the text renderings used by `replay`.

The export format is the conversation as JSON with its hash-chained messages
(and the partial reply, if any, as a trailing message with status ``partial``);
importing it reproduces the same hashes. A plain OpenAI ``messages`` list
(``[{"role": ..., "content": ...}, ...]``, bare or under a ``messages`` key
without hashes) is imported as a new conversation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import ChatstateError, CorruptTranscriptError
from .transcript import (
    SCHEMA_VERSION,
    Conversation,
    Message,
    brief,
    check_schema,
    new_id,
    new_turn_id,
    validate_id,
    verify_chain,
)

ROLES = {"system", "user", "assistant", "tool"}
_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def to_document(conv: Conversation, *, export: bool = False) -> dict[str, Any]:
    """As JSON. For replay the partial reply is a trailing message with status ``partial``;
    an export keeps it apart (``partial``) so an import restores it as the partial."""
    messages = [m.model_dump() for m in conv.messages]
    partial = conv.partial.model_dump() if conv.partial is not None else None
    if export:
        return {"schema": SCHEMA_VERSION, **conv.header(), "messages": messages,
                "partial": partial}
    if partial is not None:
        messages.append(partial)
    return {"schema": SCHEMA_VERSION, **conv.header(), "messages": messages}


def dumps(data: Any, *, indent: int | None = None) -> str:
    """JSON that keeps non-ASCII text readable but escapes DEL, C1 and the bidi overrides.

    json.dumps already escapes C0 controls (ESC included); with ensure_ascii off it
    would pass U+007F-U+009F through raw, and some terminals act on C1 (U+009B is
    CSI), or the bidi overrides that reorder what is shown. These can only occur
    inside JSON strings, so escaped the document decodes to exactly the same data.
    """
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}",
                   json.dumps(data, ensure_ascii=False, indent=indent))


def export_json(conv: Conversation) -> str:
    """The export file's text: the conversation, its hashes and any partial reply apart."""
    return dumps(to_document(conv, export=True), indent=2) + "\n"


def render(conv: Conversation, fmt: str) -> str:
    """The conversation as text, markdown, json or jsonl (messages + partial)."""
    doc = to_document(conv)
    if fmt == "json":
        return dumps(doc, indent=2)
    if fmt == "jsonl":
        return "\n".join(dumps(m) for m in doc["messages"])
    lines = []
    if fmt == "markdown":
        lines.append(f"# {conv.title or conv.id}\n")
    for m in doc["messages"]:
        tag = " (partial: cut off)" if m["status"] == "partial" else ""
        if fmt == "markdown":
            lines.append(f"**{m['role']}**{tag} · seq {m['seq']}\n\n{m['content']}\n")
        else:
            lines.append(f"[{m['seq']}] {m['role']}{tag}: {m['content']}")
    return "\n".join(lines)


def read_import(path: Path) -> tuple[Conversation, list[Message]]:
    """Parse an export or a plain OpenAI messages list; raise a clear error for anything else."""
    where = str(path)
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ChatstateError(f"{where}: cannot import: not readable JSON ({exc}). Expected a "
                             "chatstate export or an OpenAI messages list.") from exc
    if isinstance(data, dict) and "schema" in data:
        return _from_export(data, where)
    raw = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(raw, list) or not raw or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
            for m in raw):
        raise ChatstateError(f"{where}: cannot import: not a chatstate export and not an "
                             "OpenAI messages list ([{\"role\": \"user\", \"content\": "
                             "\"...\"}, ...]).")
    title = data.get("title", "") if isinstance(data, dict) else ""
    conv = Conversation(id=new_id("import"), title=str(title))
    messages: list[Message] = []
    turn = new_turn_id()
    for item in raw:
        if item["role"] == "user":
            turn = new_turn_id()
        prev = messages[-1] if messages else None
        messages.append(Message.seal(prev, role=item["role"], content=item["content"],
                                     turn_id=turn))
    return conv, messages


def _from_export(data: dict[str, Any], where: str) -> tuple[Conversation, list[Message]]:
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
    return conv, messages
