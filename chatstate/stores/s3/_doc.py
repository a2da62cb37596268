"""Object keys of the s3 store and the strict codecs of the documents stored under them.

Every document is a JSON object carrying ``"schema"``; every decoder checks it
with ``check_schema`` and raises ``CorruptTranscriptError`` naming the object
(``s3://bucket/prefix/key``) and, for messages, the seq position.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from chatstate.core.transcript import Message, check_schema, parse_message, schema_for
from chatstate.errors import CorruptTranscriptError

SEQ_WIDTH = 10
MARKER = "chatstate.json"
INDEX = "index"
OPENS = "_opens"
PROBES = "_probe"
CONVERSATIONS = "conversations"
HEADER_TYPES: dict[str, type] = {"id": str, "title": str, "created_at": str,
                                 "updated_at": str, "metadata": dict}


def conv_dir(cid: str) -> str:
    return f"{CONVERSATIONS}/{cid}"


def header_key(cid: str) -> str:
    return f"{conv_dir(cid)}/header.json"


def partial_key(cid: str) -> str:
    return f"{conv_dir(cid)}/partial.json"


def segments_dir(cid: str) -> str:
    return f"{conv_dir(cid)}/m"


def snapshots_dir(cid: str) -> str:
    return f"{conv_dir(cid)}/snap"


def segment_key(cid: str, seq: int) -> str:
    return f"{segments_dir(cid)}/{seq:0{SEQ_WIDTH}d}.json"


def snapshot_key(cid: str, seq: int) -> str:
    return f"{snapshots_dir(cid)}/{seq:0{SEQ_WIDTH}d}.json"


def index_key(cid: str) -> str:
    return f"{INDEX}/{cid}.json"


def seq_of(key: str, where: str) -> int:
    """The seq a segment or snapshot key is named after."""
    name = key.rsplit("/", 1)[-1]
    stem = name[:-5] if name.endswith(".json") else ""
    if len(stem) != SEQ_WIDTH or not stem.isdigit():
        raise CorruptTranscriptError(f"{where}: unexpected object in a chatstate conversation "
                                     "(not <seq>.json); it was left as it is", where=where)
    return int(stem)


def open_key(record: dict[str, Any], suffix: str) -> str:
    """Named after the record's own time, so listing keys lists opens oldest first."""
    stamp = datetime.now(timezone.utc)
    raw = record.get("opened_at")
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            stamp = parsed.astimezone(timezone.utc) if parsed.tzinfo else \
                parsed.replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    return f"{OPENS}/{stamp.strftime('%Y%m%dT%H%M%S%fZ')}-{suffix}.json"


def encode(doc: dict[str, Any], schema: int = 1) -> bytes:
    """``schema`` 2 for a document holding messages with 0.2 fields (see ``schema_for``)."""
    return json.dumps({"schema": schema, **doc}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def decode(raw: bytes, where: str) -> dict[str, Any]:
    """Parse one stored document and check its schema version."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptTranscriptError(
            f"{where}: not valid UTF-8 JSON ({exc}); it may be truncated or tampered with. "
            "The object was left as it is.", where=where) from exc
    if not isinstance(doc, dict):
        raise CorruptTranscriptError(f"{where}: expected a JSON object, found "
                                     f"{type(doc).__name__}; left as it is", where=where)
    check_schema(doc.get("schema"), where)
    return doc


def _field_error(where: str, fields: str) -> CorruptTranscriptError:
    return CorruptTranscriptError(f"{where}: field(s) {fields} missing or of the wrong type; "
                                  "the object was left as it is", where=where)


def decode_header(raw: bytes, where: str, cid: str) -> dict[str, Any]:
    doc = decode(raw, where)
    wrong = [k for k, t in HEADER_TYPES.items() if not isinstance(doc.get(k), t)]
    if wrong or doc["id"] != cid:
        raise _field_error(where, ", ".join(wrong) or "id")
    return {k: doc[k] for k in HEADER_TYPES}


def decode_index(raw: bytes, where: str) -> dict[str, Any]:
    doc = decode(raw, where)
    types: dict[str, Any] = {**HEADER_TYPES, "message_count": int, "last_hash": (str, type(None))}
    types.pop("metadata")
    wrong = [k for k, t in types.items() if not isinstance(doc.get(k), t)]
    shift = doc.get("shift", 0)  # the rewrites the head had seen (absent: none)
    if not isinstance(shift, int) or isinstance(shift, bool) or shift < 0:
        wrong.append("shift")
    if wrong:
        raise _field_error(where, ", ".join(wrong))
    return doc


def _message(item: Any, where: str, position: int) -> Message:
    return parse_message(item, where, position)


def decode_messages(raw: bytes, where: str, first_seq: int) -> list[Message]:
    """A segment or snapshot: ``messages`` starting at ``first_seq`` (chain checked by caller)."""
    return _messages_of(decode(raw, where), where, first_seq)


def _messages_of(doc: dict[str, Any], where: str, first_seq: int) -> list[Message]:
    items = doc.get("messages")
    if not isinstance(items, list) or not items:
        raise _field_error(where, "messages")
    out = [_message(item, where, first_seq + i) for i, item in enumerate(items)]
    for i, msg in enumerate(out):
        if msg.seq != first_seq + i:
            raise CorruptTranscriptError(
                f"{where}: holds seq {msg.seq} where seq {first_seq + i} belongs (renamed, "
                "reordered or tampered with); left as it is", where=where,
                position=first_seq + i)
    return out


def encode_messages(cid: str, messages: list[Message], *, shift: int = 0) -> bytes:
    """A segment, or a snapshot (``shift``: the slots the rewrites before it took)."""
    body: dict[str, Any] = {"conversation": cid, "messages": [m.stored() for m in messages]}
    if shift:
        body["shift"] = shift
    return encode(body, schema_for(messages))


def encode_rewrite(cid: str, messages: list[Message], replaces: str | None) -> bytes:
    """A rewrite segment: every message of the conversation (seq 0 on), replacing the
    chain before it; ``replaces`` is the stored last hash it was made against."""
    return encode({"conversation": cid, "rewrite": {"replaces": replaces},
                   "messages": [m.stored() for m in messages]}, schema_for(messages))


def decode_segment(raw: bytes, where: str, first_seq: int | None
                   ) -> tuple[list[Message] | None, bool]:
    """A segment object: its messages and whether it is a rewrite (then they start at
    seq 0 and replace the chain before it; otherwise at ``first_seq``; with ``first_seq``
    None a plain segment's are not decoded: None)."""
    doc = decode(raw, where)
    if doc.get("rewrite") is not None:
        return _messages_of(doc, where, 0), True
    return (None if first_seq is None else _messages_of(doc, where, first_seq)), False


def decode_snapshot(raw: bytes, where: str) -> tuple[list[Message], int]:
    """A snapshot's messages (seq 0 on) and its shift: the slots taken by rewrites before
    its end (0 when it names none)."""
    doc = decode(raw, where)
    shift = doc.get("shift", 0)
    if not isinstance(shift, int) or isinstance(shift, bool) or shift < 0:
        raise _field_error(where, "shift")
    return _messages_of(doc, where, 0), shift


def decode_partial(raw: bytes, where: str) -> Message:
    doc = decode(raw, where)
    msg = doc.get("message")
    position = msg.get("seq") if isinstance(msg, dict) else None
    return _message(msg, where, position if isinstance(position, int) else -1)


def encode_partial(cid: str, msg: Message, *, claimed: bool = False) -> bytes:
    """``claimed``: another writer is keeping this partial in the chain (so the bytes,
    and the e-tag, change and the streaming writer's next If-Match fails)."""
    body: dict[str, Any] = {"conversation": cid, "message": msg.stored()}
    if claimed:
        body["claimed"] = True
    return encode(body, schema_for([msg]))
