"""The json store's side of the encrypted store's load with the key: every stored
sealed message's sealed bytes and clear fields (what a ``codec.binary_row`` holds), cut
out of its document line, or taken from its log record as parsed, and handed over a
chunk at a time (``codec.ROWS_PER_TAKE``) as the file is scanned: the lines are found in
the bytes read, not split out, and each chunk is opened before the next is cut, so a
long conversation's rows never all exist at once. The chain over the stored bytes is not
hashed here: ``SealedStore._keyed_load`` checks every record's tag and its clear fields
against its plaintext instead, and leaves that chain to ``verified_load``, as it does
for sqlite's rows."""

from __future__ import annotations

from typing import Any

import orjson

from chatstate.stores import _b64 as b64
from chatstate.stores.codec import (
    CHAINED,
    ROW_END,
    ROW_HEAD,
    ROW_MID,
    ROW_SEQ,
    ROW_STATUS,
    ROWS_PER_TAKE,
    SEALED_PART,
    Take,
    clear_fields,
)
from chatstate.stores.json._doc import LOG_START, header_line
from chatstate.stores.json._log import decode_records

_END = ROW_END[:-1] + b',"hash":"'
"""How a sealed message's document line ends, but for its hash (64 hex digits) and ``"}``."""
_TAIL = len(_END) + 66
_KEYS = {"content", "created_at", "hash", "model", "params", "role", "seq", "status",
         "turn_id", "usage"}


def sealed_rows(raw: bytes, where: str, take: Take
                ) -> tuple[dict[str, Any], int, str | None] | None:
    """(the header, how many rows were taken, the last stored hash) of a conversation
    file whose rows all went to ``take``; None when any message is not a sealed record
    without blobs laid out as ``SealedStore._seal`` writes it, the file is not laid out
    as written (the verified path then reads it, and names what is wrong), or ``take``
    said stop."""
    first = raw.find(b"\n")
    got = header_line(raw[:first], where) if first > 0 else None
    if got is None:
        return None
    header, count = got
    sealed: list[bytes] = []
    clears: list[bytes] = []
    add, add_clear = sealed.append, clears.append
    find, starts, decode = raw.find, raw.startswith, b64.decode
    head, mid, seq_at, status_at = len(ROW_HEAD), len(ROW_MID), len(ROW_SEQ), len(ROW_STATUS)
    pos, last_line, stop = first + 1, count - 1, 0
    try:
        for position in range(count):
            newline = find(b"\n", pos)
            stop = newline - 1 if position < last_line else newline  # the comma between
            end = find(b'"', pos + head, stop)
            created = end + mid
            seq = find(ROW_SEQ, created, stop)
            status = find(ROW_STATUS, seq, stop)
            tail = stop - _TAIL
            if newline < 0 or end < 0 or seq < 0 or status < 0 or not (
                    starts(ROW_HEAD, pos) and starts(ROW_MID, end) and starts(_END, tail)
                    and starts(b'"},\n' if position < last_line else b'"}\n', stop - 2)
                    and raw[seq + seq_at:status] == b"%d" % position):
                return None
            add(decode(raw[pos + head:end]))
            add_clear(clear_fields(raw[created:seq], raw[status + status_at:tail]))
            if len(sealed) == ROWS_PER_TAKE:
                if not take(sealed, clears):
                    return None
                sealed, clears = [], []
                add, add_clear = sealed.append, clears.append
            pos = newline + 1
        if not starts(b"]}\n", pos):
            return None
        last = raw[stop - 66:stop - 2].decode("ascii") if count else None
        if pos + 3 < len(raw):  # log records after the document
            log = raw[pos + 3:]
            if not log.startswith(LOG_START):
                return None
            records = decode_records(log, where, count, validate=False)
            for item in records.items:
                row = _logged_row(item, count)
                if row is None:
                    return None
                add(row[1])
                add_clear(row[0])
                count += 1
                last = item["hash"]
            if records.updated_at is not None:
                header["updated_at"] = records.updated_at
    except ValueError:  # not base64, not ASCII
        return None
    if sealed and not take(sealed, clears):
        return None
    return header, count, last


def _logged_row(item: Any, position: int) -> tuple[bytes, bytes] | None:
    """(the clear fields, the sealed bytes) of a log record's message as parsed, if it
    is a sealed record without blobs at ``position``."""
    if type(item) is not dict or item.keys() != _KEYS or type(item["seq"]) is not int or \
            item["seq"] != position or item["role"] != "event" or \
            item["turn_id"] != "sealed" or not isinstance(item["hash"], str) or \
            item["model"] is not None or item["params"] is not None or \
            item["usage"] is not None:
        return None
    content, created, status = item["content"], item["created_at"], item["status"]
    if type(content) is not list or len(content) != 1 or type(content[0]) is not dict or \
            content[0].keys() != {"data", "type", "v"} or \
            content[0]["type"] != SEALED_PART or content[0]["v"] != CHAINED or \
            not isinstance(content[0]["data"], str) or not isinstance(created, str) or \
            not isinstance(status, str):
        return None
    return (clear_fields(orjson.dumps(created), orjson.dumps(status)),
            b64.decode(content[0]["data"]))
