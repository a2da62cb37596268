"""Decoding the message rows of the relational stores (sqlite, postgresql), chain verified.

A body is the message's canonical JSON (what its hash covers), or an encrypted
store's binary row standing for one (``codec.binary_row``, expanded here), so verifying is
one sha256 per row; the bodies are parsed by orjson and checked by the fast
structural test in chunks, and only a damaged chunk is walked row by row to name
the bad seq.
"""

from __future__ import annotations

import json
from operator import attrgetter, itemgetter
from typing import Any

from chatstate._gcpause import paused
from chatstate.core.canonical import chain_hash
from chatstate.core.transcript import Message, brief, parse_message
from chatstate.errors import CorruptTranscriptError
from chatstate.stores._fastload import chain_intact, first_break, stored_chunk


def row_text(raw: bytes | None, where: str, seq: int) -> str:
    if raw is None:  # sqlite: a long body's row in long_bodies is gone
        raise CorruptTranscriptError(f"{where}: message seq {seq} has no stored body (its "
                                     "long body is missing); the database was left as it is",
                                     where=where, position=seq)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptTranscriptError(f"{where}: message seq {seq} is not valid UTF-8 (byte "
                                     f"{exc.start}); the database was left as it is",
                                     where=where, position=seq) from exc


def row_message(body: str, hash_: str, where: str, seq: int) -> Message:
    """A stored body as a Message; a damaged row names its seq, in one line."""
    try:
        item = json.loads(body)
        if not isinstance(item, dict):
            raise ValueError(f"expected a JSON object, found {type(item).__name__}")
    except ValueError as exc:
        raise CorruptTranscriptError(f"{where}: message seq {seq} is unreadable "
                                     f"({brief(exc)}); the database was left as it is",
                                     where=where, position=seq) from exc
    return parse_message({**item, "hash": hash_}, where, seq)


def decode_rows(rows: list[Any], where: str, chunk: int = 512, *, start: int = 0,
                prev: str | None = None) -> tuple[list[Message], bool]:
    """Every row as a Message, the chain verified; damage is named by its seq. And
    whether every message's content is a string (so none names a blob), found while
    each chunk's records are fresh in the cache rather than in another pass over all.

    The fast path parses each body with orjson (kept only if it encodes back to the
    very bytes stored), checks it with the transcript's fast structural test
    (pydantic only for a body that test does not pass) and hashes those same bytes,
    a chunk of rows at a time; anything odd falls back to the row-by-row path from
    that chunk on (the ones before it verified), which names the first bad row.

    ``rows`` is consumed: each chunk's rows are let go once its messages are made, so
    the memory of their bodies is reused for the next chunks' records instead of the
    process taking (and the kernel zeroing) as much again.
    """
    messages: list[Message] = []
    first, texts = start, True
    try:
        with paused():  # the rows and records made are many, and none in a cycle
            for start in range(first, first + len(rows), chunk):
                stop = min(start + chunk, first + len(rows))
                seqs, raws, hashes = zip(*rows[start - first:stop - first], strict=True)
                if seqs != tuple(range(start, stop)):
                    raise ValueError("a gap in the seqs")  # the slow path names it
                intact = chain_intact(raws, hashes, prev)  # while the chunk is in the cache
                decoded = stored_chunk(raws, hashes)
                if not intact or tuple(map(attrgetter("seq"), decoded)) != seqs:
                    bad = first_break(decoded, raws, prev, start, exact=True)
                    if bad is not None:
                        _broken(where, bad)
                prev = hashes[-1]
                messages.extend(decoded)
                texts = texts and set(map(type, map(attrgetter("content"), decoded))) == {str}
                rows[start - first:stop - first] = _NONE * (stop - start)
    except (ValueError, TypeError, AttributeError):  # invalid, not UTF-8, a gap: find the row
        from chatstate.stores.codec import is_binary_row  # not at start-up: ``ask`` stays light

        rest = rows[start - first:]
        if any(map(is_binary_row, map(itemgetter(1), rest))):  # an encrypted store's binary
            rest = list(map(_expanded, rest))  # rows, as the canonical bodies they stand for
            if not any(map(is_binary_row, map(itemgetter(1), rest))):
                done, _ = decode_rows(rest, where, chunk, start=start, prev=prev)
                return messages + done, False
        return messages + _decode_rows_one_by_one(rest, where, start, prev), False
    return messages, texts


def _expanded(row: Any) -> Any:
    """A row (seq, body, hash) with a binary row's body expanded (``codec.expand_row``);
    any other row, or one that is not a binary row after all, as it is."""
    from chatstate.stores.codec import row_body

    seq, raw, hash_ = row
    return seq, row_body(seq, raw), hash_


_NONE = [None]


def _decode_rows_one_by_one(rows: list[Any], where: str, start: int = 0,
                            prev: str | None = None) -> list[Message]:
    """``decode_rows`` a row at a time, ``rows`` from seq ``start`` on (``prev``: the
    hash before it)."""
    messages: list[Message] = []
    for position, (seq, raw, hash_) in enumerate(rows, start):
        body = row_text(raw, where, seq)
        msg = row_message(body, hash_, where, seq)
        if seq != position or msg.seq != seq or chain_hash(prev, body) != hash_:
            _broken(where, position)
        messages.append(msg)
        prev = hash_
    return messages


def _broken(where: str, position: int) -> None:
    raise CorruptTranscriptError(
        f"{where}: hash chain broken at seq {position} (a message was edited, removed or "
        "reordered); the database was left as it is", where=where, position=position)
