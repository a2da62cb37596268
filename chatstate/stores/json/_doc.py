"""The on-disk JSON document of one conversation, and its strict decoder.

Layout: the header on the first line, then one message per line, so the file
is valid JSON, greppable, and listable by reading one line::

    {"schema":1,"id":"support-42",...,"message_count":2,"messages":[
    {"seq":0,"role":"user",...,"hash":"…"},
    {"seq":1,"role":"assistant",...,"hash":"…"}
    ]}
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import orjson

from chatstate._gcpause import paused
from chatstate.core.canonical import json_with_text, long_text, split_around, text_json
from chatstate.core.transcript import (
    Conversation,
    Message,
    check_schema,
    parse_message,
    schema_for,
)
from chatstate.errors import CorruptTranscriptError
from chatstate.stores._fastload import (
    canonical,
    document_chain,
    first_break,
    validate_items,
)
from chatstate.stores.json._log import DOC_END, Records, decode_records, split

HEADER_KEYS = ("id", "title", "created_at", "updated_at", "metadata")


def message_line(msg: Message) -> str:
    return _dump_line(msg.stored())


def _dump_line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class LongLine:
    """The line of a message with a long text content (``line_of``): made again, a slice
    at a time, whenever it is written, so its text is held once, by its message."""

    __slots__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message

    def pieces(self) -> Iterator[bytes]:
        pieces = json_with_text(self.message.stored(), _dump_line)
        if pieces is None:
            yield message_line(self.message).encode()
            return
        yield from pieces


Line = str | LongLine
"""A message's line as the store keeps it: the text, or a ``LongLine``."""


def line_of(msg: Message) -> Line:
    """``message_line``, or for a long text content (``long_text``) its ``LongLine``."""
    return LongLine(msg) if long_text(msg.content) else message_line(msg)


def joined(lines: Iterable[Line], sep: bytes) -> Iterator[bytes]:
    """The lines, UTF-8, ``sep`` between them: short ones joined, long ones in slices."""
    run: list[str] = []
    for i, line in enumerate(lines):
        if i:
            run.append(sep.decode())
        if isinstance(line, str):
            run.append(line)
            continue
        if run:
            yield "".join(run).encode()
            run = []
        yield from line.pieces()
    if run:
        yield "".join(run).encode()


def encode(header: dict[str, Any], lines: list[Line], schema: int = 1) -> Iterator[bytes]:
    """The document, in pieces made as they are written (``joined``). ``schema``:
    ``schema_for`` the messages (2 once any holds a 0.2 field)."""
    head = {"schema": schema, **{k: header[k] for k in HEADER_KEYS},
            "message_count": len(lines)}
    first = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
    yield (first + ',"messages":[\n').encode()
    yield from joined(lines, b",\n")
    yield b"\n]}\n" if lines else b"]}\n"


def decode(raw: bytes, where: str) -> tuple[dict[str, Any], list[Message]]:
    """Parse and fully verify a stored conversation; raise CorruptTranscriptError naming where."""
    header, messages, _ = decode_file(raw, where)
    return header, messages


_LONG_NUMBER = re.compile(rb"[0-9]{19}")
"""Where an integer orjson reads as a float (past 64 bits) may stand."""


def decode_file(raw: bytes, where: str) -> tuple[dict[str, Any], list[Message], Records | None]:
    """``decode`` for a document followed by log records (``_log``): the records too.

    orjson reads an integer past 64 bits as a float, whose body then hashes otherwise:
    a file that fails so and may hold one is read again by the exact parser (the
    standard library's), which decides."""
    try:
        return _decode_file(raw, where, orjson.loads)
    except CorruptTranscriptError:
        if not _LONG_NUMBER.search(raw):
            raise
    return _decode_file(raw, where, json.loads)


def _decode_file(raw: bytes, where: str, loads: Callable[[bytes], Any]
                 ) -> tuple[dict[str, Any], list[Message], Records | None]:
    parts = None if raw.endswith(DOC_END) else split(raw)  # a document alone: no search
    records = None
    with paused():  # a long document makes many dicts and records, none in a cycle
        if parts is None or not parts[1].startswith(b'{"schema":'):
            header, messages, items = _decode_doc(raw, where, loads)
        else:
            header, messages, items = _decode_doc(parts[0], where, loads)
            records = decode_records(parts[1], where, len(messages), loads=loads)
    logged = records.messages if records is not None else []
    if items is None:  # the document's chain is verified: the records continue it
        start = len(messages)
        bad = first_break(logged, records.bodies if records is not None else [],
                          messages[-1].hash if messages else None, start)
    else:
        bad = first_break(messages + logged, chain(
            _bodies(items), records.bodies if records is not None else []))
    if records is not None:
        messages = messages + logged
        if records.updated_at is not None:
            header["updated_at"] = records.updated_at
    if bad is not None:
        raise CorruptTranscriptError(
            f"{where}: hash chain broken at seq {bad} (a message was edited, removed or "
            "reordered); the file was left as it is. `chatstate repair` quarantines it.",
            where=where, position=bad)
    return header, messages, records


def _bodies(items: list[Any]) -> Iterator[bytes | None]:
    """What each stored message hashes, made one at a time (first_break consumes them)."""
    return (canonical(item) if isinstance(item, dict) else None for item in items)


Row = tuple[int, bytes, str]
"""(seq, canonical body, hash) of a stored message."""


def stored_rows(raw: bytes, where: str) -> tuple[dict[str, Any], list[Row]] | None:
    """``checked_rows`` without the count."""
    got = checked_rows(raw, where)
    return None if got is None else (got[0], got[1])


def checked_rows(raw: bytes, where: str) -> tuple[dict[str, Any], list[Row], int] | None:
    """The header and every stored message of a conversation file (document and log
    records) as (seq, canonical body, hash), neither validated nor chain-checked, for a
    caller that checks the chain itself (the encrypted store's load); None when the file
    is not laid out as ``encode`` writes it (``decode_file`` then names what is wrong).

    A document line that is its canonical body with ``"hash"`` last (how the encrypted
    store's records are written) is cut, not parsed, when its bytes hash to its stored
    hash after the line before: its seq is then its position (the body is the hashed
    one, seq and all). Any other line is parsed and made canonical (``canonical``).
    The count returned: how many rows from the first were cut so, their stored chain
    verified (a caller checking the chain need not hash them again).
    """
    laid = laid_out(raw, where)
    if laid is None:
        return None
    header, body, log = laid
    rows: list[Row] = []
    prev = b""
    checked = -1
    for position, line in enumerate(body):
        if position < len(body) - 1:
            if not line.endswith(b","):
                return None
            line = line[:-1]
        row = _cut(line, prev, position)
        if row is None:
            if checked < 0:
                checked = position
            row = _parsed_line(line)
            if row is None:
                return None
        rows.append(row)
        prev = row[2].encode()
    if checked < 0:
        checked = len(rows)
    if log is not None:
        records = decode_records(log, where, len(rows), validate=False)
        for item in records.items:
            row = _parsed_row(item)
            if row is None:
                return None
            rows.append(row)
        if records.updated_at is not None:
            header["updated_at"] = records.updated_at
    return header, rows, checked


def laid_out(raw: bytes, where: str) -> tuple[dict[str, Any], list[bytes], bytes | None] | None:
    """A conversation file as ``encode`` lays it out: (the header, each document line
    of a message, a trailing comma and all, the log records after the document, if any);
    None when it is not laid out so. Neither the lines nor the records are checked."""
    parts = None if raw.endswith(DOC_END) else split(raw)
    if parts is not None and not parts[1].startswith(LOG_START):
        return None
    lines = (raw if parts is None else parts[0]).split(b"\n")
    if len(lines) < 3 or lines[-2:] != [b"]}", b""]:
        return None
    got = header_line(lines[0], where)
    if got is None or got[1] != len(lines) - 3:
        return None
    return got[0], lines[1:-2], None if parts is None else parts[1]


LOG_START = b'{"schema":'
"""How the first log record after a document starts."""
_MARK = b',"messages":['


def header_line(line: bytes, where: str) -> tuple[dict[str, Any], int] | None:
    """(the header, the message count it records) of a document's first line as
    ``encode`` writes it; None when it is not one (its schema is checked: a newer one
    raises, as everywhere)."""
    if not line.endswith(_MARK):
        return None
    try:
        head = orjson.loads(line[:-len(_MARK)] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict):
        return None
    check_schema(head.get("schema"), where)
    header = {k: head.get(k) for k in HEADER_KEYS}
    types = {"id": str, "title": str, "created_at": str, "updated_at": str, "metadata": dict}
    count = head.get("message_count")
    if any(not isinstance(header[k], t) for k, t in types.items()) or \
            type(count) is not int or count < 0:
        return None
    return header, count


def _cut(line: bytes, prev: bytes, position: int) -> Row | None:
    """The row of a line that is its canonical body and ``"hash"`` last, when the body
    hashes to that hash after ``prev``; else None."""
    cut = line.rfind(b',"hash":"')
    if cut > 0 and len(line) == cut + 75 and line.endswith(b'"}'):
        candidate, digest = line[:cut] + b"}", line[cut + 9:cut + 73]
        h = hashlib.sha256(prev)
        h.update(candidate)
        if h.hexdigest().encode() == digest:
            return position, candidate, digest.decode()
    return None


def _parsed_line(line: bytes) -> Row | None:
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return _parsed_row(item)


def _parsed_row(item: Any) -> Row | None:
    body = canonical(item) if isinstance(item, dict) else None
    if body is None or type(item.get("seq")) is not int or not isinstance(item.get("hash"), str):
        return None
    return item["seq"], body, item["hash"]


def _parse_doc(raw: bytes, where: str, loads: Callable[[bytes], Any] = orjson.loads
               ) -> dict[str, Any]:
    """The document parsed, its schema and header checked."""
    try:
        doc = loads(raw)
    except ValueError:  # orjson's JSONDecodeError, json's, or bad UTF-8
        doc = _strict_parse(raw, where)  # names the byte or line that is wrong
    if not isinstance(doc, dict):
        raise CorruptTranscriptError(f"{where}: expected a JSON object, found "
                                     f"{type(doc).__name__}", where=where)
    check_schema(doc.get("schema"), where)
    header = {k: doc.get(k) for k in HEADER_KEYS}
    types = {"id": str, "title": str, "created_at": str, "updated_at": str, "metadata": dict}
    wrong = [k for k, t in types.items() if not isinstance(header[k], t)]
    if wrong or not isinstance(doc.get("messages"), list):
        raise CorruptTranscriptError(
            f"{where}: header field(s) {', '.join(wrong) or 'messages'} missing or of the "
            "wrong type; the file was left as it is.", where=where)
    return doc


def _decode_doc(raw: bytes, where: str, loads: Callable[[bytes], Any] = orjson.loads
                ) -> tuple[dict[str, Any], list[Message], list[Any] | None]:
    """The header, the messages and their items as parsed; no items (None) when the
    messages came by ``document_chain``, their chain already verified."""
    doc = _parse_doc(raw, where, loads)
    header = {k: doc.get(k) for k in HEADER_KEYS}
    items = doc["messages"]
    if doc.get("message_count") == len(items):
        fast = document_chain(items)
        if fast is not None:
            return header, fast, None
    try:
        messages = validate_items(items)
    except ValueError:  # pydantic's ValidationError: name the first bad message
        messages = [parse_message(item, where, index) for index, item in enumerate(items)]
    count = doc.get("message_count")
    if count != len(messages):  # the chain cannot see its own tail cut off; the count can
        bad = first_break(messages, _bodies(items))  # but a broken chain is named first
        if bad is not None:
            raise CorruptTranscriptError(
                f"{where}: hash chain broken at seq {bad} (a message was edited, removed or "
                "reordered); the file was left as it is. `chatstate repair` quarantines it.",
                where=where, position=bad)
        position = min(count, len(messages)) if isinstance(count, int) else len(messages)
        raise CorruptTranscriptError(
            f"{where}: header message_count is {count!r} but {len(messages)} messages are "
            f"stored (cut off or added by hand from seq {position}); the file was left as "
            "it is. `chatstate repair` quarantines it.", where=where, position=position)
    return header, messages, items


def _strict_parse(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptTranscriptError(
            f"{where}: not valid UTF-8 at byte {exc.start}; the file was left as it is. "
            "Restore it from a backup or move it aside with `chatstate repair`.",
            where=where) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptTranscriptError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "it may be truncated. The file was left as it is.", where=where) from exc


def stored_lines(raw: bytes, count: int) -> list[Line] | None:
    """The message lines of a file in the layout ``encode`` writes, as they are on disk
    (what ``message_line`` would write again); None if the file is laid out otherwise."""
    lines = raw.decode("utf-8").split("\n")
    if count == 0 or len(lines) != count + 3 or lines[-2] != "]}" or lines[-1] != "" \
            or not lines[0].endswith(',"messages":['):
        return None
    body = lines[1:count + 1]
    if not all(line.endswith(",") for line in body[:-1]) or body[-1].endswith(","):
        return None
    found: list[Line] = [line[:-1] for line in body[:-1]]
    found.append(body[-1])
    return found


class Lines:
    """A snapshot's message lines (``message_line`` of each), cut from the file as read
    only when a write first needs them: a load alone never splits the file into lines."""

    __slots__ = ("_in_doc", "_lines", "_messages", "_raw")

    def __init__(self, lines: list[Line] | None = None, *, raw: bytes = b"", in_doc: int = 0,
                 messages: Sequence[Message] = ()) -> None:
        self._lines = lines
        self._raw, self._in_doc = raw, in_doc  # the document part of the file, its count
        self._messages = list(messages)  # document and records, as verified

    def get(self) -> list[Line]:
        """The lines (a list the caller may extend: the snapshot grows with it)."""
        if self._lines is None:
            in_doc, messages = self._in_doc, self._messages
            # the verified lines as read, when laid out as written: no re-serialising
            lines = (stored_lines(self._raw, in_doc)
                     or [message_line(m) for m in messages[:in_doc]])
            lines += [message_line(m) for m in messages[in_doc:]]
            self._lines, self._raw, self._messages = lines, b"", []
        return self._lines


def decode_partial(raw: bytes, where: str) -> Message:
    """The partial reply in a sidecar: the last whole record of an append-only log.

    Each flush appends one whole record and its newline, fsynced before the next
    flush starts; a last line without its newline is a write that a crash cut off
    before it was acknowledged, so the record before it stands. A filesystem may
    also tear an unsynced append so that its newline lands but its middle does not
    (zeros, or a cut record): an unreadable last record falls back to the one before
    it, which was whole and acknowledged. Only the last record can be torn so: an
    unreadable one before it is damage, and is reported. A file of one line without
    a newline is the older single-document sidecar.
    """
    lines = raw.split(b"\n")
    records = lines[:-1] if len(lines) > 1 else lines
    try:
        return _partial_record(records[-1], where)
    except CorruptTranscriptError:
        if len(records) < 2:
            raise
    return _partial_record(records[-2], where)


def _partial_record(record: bytes, where: str) -> Message:
    try:
        doc = json.loads(record)
        check_schema(doc.get("schema"), where)
        return Message.model_validate(doc["message"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptTranscriptError(f"{where}: unreadable partial reply ({exc}); left as it "
                                     "is", where=where) from exc


def encode_partial(conversation_id: str, msg: Message) -> Iterable[bytes]:
    """One line of the sidecar (see decode_partial), as UTF-8 pieces: for a long text
    content (``long_text``) made a slice at a time as it is written."""
    stored = msg.stored()
    record = {"schema": schema_for([msg]), "conversation": conversation_id, "message": stored}
    if long_text(msg.content):
        stored["content"] = ""
        around = split_around(json.dumps(record, ensure_ascii=False), colon=": ")
        if around is not None:
            return _partial_pieces(around, msg.content)
        stored["content"] = msg.content
    return [json.dumps(record, ensure_ascii=False).encode() + b"\n"]


def _partial_pieces(around: tuple[bytes, bytes], content: Any) -> Iterator[bytes]:
    yield around[0]
    yield from text_json(content)
    yield around[1] + b"\n"


def to_conversation(header: dict[str, Any], messages: list[Message],
                    partial: Message | None) -> Conversation:
    return Conversation.model_construct(
        id=header["id"], title=header.get("title") or "", created_at=header["created_at"],
        updated_at=header["updated_at"], metadata=header.get("metadata") or {},
        messages=messages, partial=partial)
