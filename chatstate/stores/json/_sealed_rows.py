"""The json store's side of the encrypted store's load with the key: every stored
sealed message as the binary row it stands for (``codec.binary_row``: its clear fields
and its sealed bytes), cut out of its document line, or taken from its log record as
parsed. The chain over the stored bytes is not hashed here: ``SealedStore._keyed_load``
checks every record's tag and its clear fields against its plaintext instead, and leaves
that chain to ``verified_load``, as it does for sqlite's rows."""

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
    SEALED_PART,
    binary_row,
)
from chatstate.stores.json._doc import laid_out
from chatstate.stores.json._log import decode_records

_END = ROW_END[:-1] + b',"hash":"'
"""How a sealed message's document line ends, but for its hash (64 hex digits) and ``"}``."""
_TAIL = len(_END) + 66
_KEYS = {"content", "created_at", "hash", "model", "params", "role", "seq", "status",
         "turn_id", "usage"}


def sealed_rows(raw: bytes, where: str) -> tuple[dict[str, Any], list[bytes], str | None] | None:
    """(the header, each message's binary row in seq order, the last stored hash) of a
    conversation file; None when any message is not a sealed record without blobs laid
    out as ``SealedStore._seal`` writes it, or the file is not laid out as written (the
    verified path then reads it, and names what is wrong)."""
    laid = laid_out(raw, where)
    if laid is None:
        return None
    header, body, log = laid
    rows: list[bytes] = []
    add = rows.append
    head, mid, seq_at, status_at = len(ROW_HEAD), len(ROW_MID), len(ROW_SEQ), len(ROW_STATUS)
    decode = b64.decode
    last_line = len(body) - 1
    last: str | None = None
    try:
        for position, line in enumerate(body):
            if position < last_line:
                if not line.endswith(b","):
                    return None
                line = line[:-1]
            end = line.find(b'"', head)
            created = end + mid
            seq = line.find(ROW_SEQ, created)
            status = line.find(ROW_STATUS, seq)
            stop = len(line) - _TAIL
            if end < 0 or seq < 0 or status < 0 or not (
                    line.startswith(ROW_HEAD) and line.startswith(ROW_MID, end)
                    and line.startswith(_END, stop) and line.endswith(b'"}')
                    and line[seq + seq_at:status] == b"%d" % position):
                return None
            row = binary_row(line[created:seq] + b"\n" + line[status + status_at:stop],
                             decode(line[head:end]))
            if row is None:
                return None
            add(row)
        if body:
            last = body[-1][-66:-2].decode("ascii")
        if log is not None:
            records = decode_records(log, where, len(rows), validate=False)
            for item in records.items:
                row = _logged_row(item, len(rows))
                if row is None:
                    return None
                add(row)
                last = item["hash"]
            if records.updated_at is not None:
                header["updated_at"] = records.updated_at
    except ValueError:  # not base64, not ASCII
        return None
    return header, rows, last


def _logged_row(item: Any, position: int) -> bytes | None:
    """The binary row of a log record's message as parsed, if it is a sealed record
    without blobs at ``position``."""
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
    return binary_row(orjson.dumps(created) + b"\n" + orjson.dumps(status),
                      b64.decode(content[0]["data"]))
