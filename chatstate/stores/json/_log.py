"""The json store's append log: O(1) appends after the conversation's document.

A conversation file is its document (``_doc``: the header line, one message per
line, ``]}``) followed by zero or more log records, one per append, each one
line::

    {"schema":1,"at":"<updated_at>","messages":[{...},{...}]}<TAB><crc32, 8 hex>

An append writes one whole record and its newline to the end of the file and
fsyncs the file: one fsync, no rename, so no directory fsync (the file already
exists). Compaction (``encode`` of the document with every message, written
atomically: temp, fsync, rename, directory fsync) folds the records back into
the document when this process closes the store, when the log outgrows the
document, and when a writer finds a torn record.

What a crash can leave, and what it means:

- a last record without its newline, or that is not a whole record (cut, zeros,
  garbled JSON): an append that a crash cut off before it was acknowledged (its
  fsync had not returned). Readers ignore it; the next writer moves its bytes
  into ``.quarantine/`` and compacts (reported in ``store.recovery``, never
  dropped silently).
- a record before the last that is not whole, or any record that is whole,
  valid JSON and fails its checksum (edited after it was written, which no crash
  produces): damage (invariant 6), named by file and seq; nothing writes over it.

A file without records is a document exactly as every earlier version wrote it,
and is read unchanged; a document alone is what compaction leaves, so a
conversation that is not being written to is readable by older versions too.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from chatstate.core.transcript import Message, check_schema, parse_message
from chatstate.errors import CorruptTranscriptError
from chatstate.stores._fastload import canonical, validate_items

DOC_END = b"\n]}\n"


def encode_record(at: str, body: Iterable[bytes], schema: int) -> Iterator[bytes]:
    """One log record holding ``body`` (the lines of the messages of one append, comma
    separated: ``_doc.joined``), in pieces made as they are written: a long message's
    line is never built whole, and the checksum is taken on the way."""
    head = f'{{"schema":{schema},"at":{orjson.dumps(at).decode()},"messages":['.encode()
    crc = zlib.crc32(head)
    yield head
    for part in body:
        crc = zlib.crc32(part, crc)
        yield part
    crc = zlib.crc32(b"]}", crc)
    yield b"]}\t%08x\n" % crc


def split(raw: bytes) -> tuple[bytes, bytes] | None:
    """(document, log) when ``raw`` is a document followed by log records, else None."""
    end = raw.find(DOC_END)
    if end < 0 or end + len(DOC_END) == len(raw):
        return None
    return raw[:end + len(DOC_END)], raw[end + len(DOC_END):]


@dataclass
class Records:
    """What the log part of a conversation file holds."""

    messages: list[Message] = field(default_factory=list)
    bodies: list[bytes | None] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)
    """The stored messages as parsed, when decoded with ``validate=False`` (then
    ``messages`` and ``bodies`` stay empty)."""
    updated_at: str | None = None
    clean: int = 0            # bytes of whole, verified records
    torn: bytes = b""         # the bytes of a torn last record (an unacknowledged append)


def _record(line: bytes, loads: Callable[[bytes], Any] = orjson.loads
            ) -> dict[str, Any] | bool | None:
    """The record on ``line``; None if it is not one whole record (what a crash mid-write
    leaves: cut, zeros, garbled JSON); False if it is whole, valid JSON, and fails its
    checksum: edited after it was written, which no crash produces."""
    body, tab, crc = line.rpartition(b"\t")
    if not tab or len(crc) != 8:
        return None
    try:
        doc = loads(body)
        sum_ok = int(crc, 16) == zlib.crc32(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list) \
            or not isinstance(doc.get("at"), str):
        return None
    return doc if sum_ok else False


def decode_records(log: bytes, where: str, start: int, *, validate: bool = True,
                   loads: Callable[[bytes], Any] = orjson.loads) -> Records:
    """The records of ``log``; ``start`` is the seq the first one continues from.

    The chain itself is checked by the caller over document and records together.
    ``validate=False``: the messages are left as parsed (``items``). ``loads``: the
    parser (``json.loads`` to read integers past 64 bits exactly).
    """
    out = Records()
    lines = log.split(b"\n")
    tail = lines.pop()  # b"" when the log ends with a whole record's newline
    seq = start
    for index, line in enumerate(lines):
        doc = _record(line, loads)
        if doc is None and index == len(lines) - 1 and not tail:
            out.torn = line + b"\n"
            return out
        if not isinstance(doc, dict):
            what = ("is whole but fails its checksum (edited after it was written)"
                    if doc is False else "is not a whole record, and records follow it")
            raise CorruptTranscriptError(
                f"{where}: the log record appending seq {seq} {what}: the file is damaged "
                "there (not a torn append); it was left as it is. `chatstate repair` "
                "quarantines it.", where=where, position=seq)
        check_schema(doc.get("schema"), where)
        items = doc["messages"]
        if not validate:
            out.items.extend(items)
            out.updated_at = doc["at"]
            out.clean += len(line) + 1
            seq += len(items)
            continue
        try:
            messages = validate_items(items)
        except ValueError:
            messages = [parse_message(item, where, seq + i) for i, item in enumerate(items)]
        out.messages.extend(messages)
        out.bodies.extend(canonical(item) if isinstance(item, dict) else None for item in items)
        out.updated_at = doc["at"]
        out.clean += len(line) + 1
        seq += len(messages)
    out.torn = tail
    return out


def last_record(tail: bytes, *, whole: bool) -> dict[str, Any] | None:
    """The last whole, verified record in ``tail`` (the end of a file; ``whole``: all of
    it), skipping a torn last one; None if the tail holds no such record."""
    lines = tail.split(b"\n")
    lines.pop()  # after the last newline: b"", or a record a crash cut off
    if not whole and lines:
        lines.pop(0)  # may start mid-line
    for line in reversed(lines[-2:]):
        if line.startswith(b'{"schema":'):
            doc = _record(line)
            if doc is False:  # damage: the whole read names it
                return None
            if isinstance(doc, dict):
                return doc
    return None
