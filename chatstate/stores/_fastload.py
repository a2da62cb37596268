"""Loading a stored chain fast: one validation pass, hashes over the bytes as stored.

Both local stores load by checking every parsed message with the transcript's
fast structural test (``Message.from_stored``: no copy, no pydantic), the pydantic
model deciding only for a message that test does not pass, and verifying the
chain in one loop (``first_break``). The hash
is taken over canonical bytes the load already has: the sqlite store keeps
each message's canonical JSON as its row, and for the json store orjson
rewrites the parsed dict canonically (sorted keys, compact, UTF-8), which is
byte for byte what ``Message.body()`` produces for every message chatstate
writes. Where it might not be (a float orjson spells differently, a lone
surrogate, a hand-edited file missing a default field) the hash would differ,
and then the exact ``Message.expected_hash`` decides: the fast path can only
say "matches" for bytes whose sha256 is the stored hash, never accept
anything the exact path would refuse, and never refuse what it accepts.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Sequence
from functools import cache, partial
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import orjson

from chatstate.core.fields import FREE_FIELDS, OPTIONAL_FIELDS, message_keys, plain_free
from chatstate.core.transcript import Message


@cache
def _message_list() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(list[Message])


def validate_json_array(array: bytes) -> list[Message]:
    """Messages from a JSON array, in one pydantic-core call (ValidationError if any is bad;
    integers of any size kept exactly)."""
    found: list[Message] = _message_list().validate_json(array)
    return found


_NUMBERED = FREE_FIELDS
"""The fields where a stored number can stand (besides seq and content's parts)."""


def parse_canonical(raw: bytes) -> dict[str, Any]:
    """A stored canonical body parsed by orjson, if it reads back exactly as stored.

    orjson turns an integer beyond 64 bits into a float. A number other than seq can
    only stand in the free-form fields (``_NUMBERED``, content parts); a body that
    uses one is encoded again and compared with the stored bytes, so a body that does
    not round-trip raises ValueError and the caller takes the exact, slower path."""
    item = orjson.loads(raw)
    if type(item) is not dict or type(item.get("seq")) is not int:
        raise ValueError("not a stored message body")
    get = item.get
    if (type(get("content")) is not str or any(get(k) is not None for k in _NUMBERED)) \
            and orjson.dumps(item, option=orjson.OPT_SORT_KEYS) != raw:
        raise ValueError("not a canonical body orjson reads back exactly")
    return item


def parse_canonicals(raws: list[bytes]) -> list[dict[str, Any]]:
    """``parse_canonical`` of each stored body (ValueError if any would raise), the
    common case in C loops: every body parsed by one ``map``, the types checked a field
    at a time, and only the bodies that may hold a number beyond 64 bits encoded again."""
    return _parsed(raws)[0]


def _parsed(raws: list[bytes]) -> tuple[list[dict[str, Any]], set[str] | None]:
    """``parse_canonicals``, and the fields the bodies hold (``message_keys``)."""
    return (items := list(map(orjson.loads, raws))), _checked(items, raws)


def _checked(items: list[Any], raws: list[bytes]) -> set[str] | None:
    """``_parsed``'s tests of the bodies ``raws`` parsed as ``items``."""
    if not items:
        return None
    if set(map(type, items)) != {dict} or \
            set(map(type, map(dict.get, items, repeat("seq")))) != {int}:
        raise ValueError("not a stored message body")
    keys = message_keys(items)
    odd: set[int] = set()
    for k in ("content", *_NUMBERED):
        if keys is not None and k not in keys:
            continue  # none of them holds it
        usual = str if k == "content" else type(None)
        if set(map(type, map(dict.get, items, repeat(k)))) != {usual}:
            odd.update(i for i, v in enumerate(map(dict.get, items, repeat(k)))
                       if type(v) is not usual)
    for i in odd:
        if orjson.dumps(items[i], option=orjson.OPT_SORT_KEYS) != raws[i]:
            raise ValueError("not a canonical body orjson reads back exactly")
    return keys


def stored_messages(rows: Iterable[tuple[bytes, str]]) -> list[Message]:
    """Messages from their stored canonical bodies and hashes: ``parse_canonical`` then
    ``validate_items`` (ValueError or TypeError for a body the exact path must decide)."""
    pairs = list(rows)
    return stored_chunk(list(map(itemgetter(0), pairs)), list(map(itemgetter(1), pairs)))


def stored_chunk(raws: Sequence[bytes], hashes: Sequence[str]) -> list[Message]:
    """``stored_messages`` of the bodies ``raws`` and their ``hashes``, given apart.

    Plain messages (what chatstate writes) take one parse and one structural check
    (``plain_free``), which also says which bodies hold free JSON, where a number
    orjson reads otherwise can stand: only those are encoded again and compared."""
    items: list[Any] = list(map(orjson.loads, raws))
    free = plain_free(items)
    if free is None or set(map(type, hashes)) != {str}:
        return _stored_slowly(items, raws, hashes)
    for i in free:
        if orjson.dumps(items[i], option=orjson.OPT_SORT_KEYS) != raws[i]:
            raise ValueError("not a canonical body orjson reads back exactly")
    deque(map(dict.__setitem__, items, repeat("hash"), hashes), maxlen=0)
    return Message.records(items)


def _stored_slowly(items: list[Any], raws: Sequence[bytes], hashes: Sequence[str]
                   ) -> list[Message]:
    """``stored_chunk`` of bodies that are not all plain messages: ``parse_canonical``'s
    tests of each, then ``validate_items`` (pydantic for those the fast check refuses)."""
    _checked(items, list(raws))
    deque(map(dict.__setitem__, items, repeat("hash"), hashes), maxlen=0)
    return validate_items(items)


def validate_items(items: list[Any]) -> list[Message]:
    """Messages from freshly parsed dicts, which they keep (not copied): the fast check
    for each, pydantic for any it does not pass (ValidationError if that one is bad)."""
    every = Message.from_stored_list(items)  # all at once, the common case
    if every is not None:
        return every
    fast = Message.from_stored
    out = []
    for item in items:
        msg = fast(item)
        out.append(msg if msg is not None else Message.model_validate(item))
    return out


def chain_intact(bodies: Iterable[bytes], hashes: Sequence[str], prev: str | None = None
                 ) -> bool:
    """Is ``hashes[i]`` the sha256 over ``hashes[i - 1]`` (``prev`` before the first)
    and ``bodies[i]``, for every i? One loop, no record made; ``bodies`` may be made as
    they are hashed (each body then hashed while it is fresh in the cache, and freed)."""
    sha = hashlib.sha256
    last = (prev or "").encode()
    try:
        for body, hash_ in zip(bodies, hashes, strict=True):
            h = sha(last)
            h.update(body)
            if h.hexdigest() != hash_:
                return False
            last = hash_.encode()
    except (TypeError, AttributeError, ValueError):  # another type, or another count
        return False
    return True


_NO_HASH: Any = object()
_sorted_json = partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)


def document_chain(items: list[Any], chunk: int = 1024) -> list[Message] | None:
    """The messages of a whole json document's list, chain verified from its start, when
    the fast path can say so for every one: each written as chatstate writes it (every
    required field, no optional one set to None, ``hash`` a string), its canonical body
    (orjson, sorted keys) hashing to the stored hash after the one before it, plainly
    valid, seq its position. None otherwise (nothing changed: the caller's exact path
    then decides, and names what is wrong). A chunk of messages at a time, each test one
    pass over the chunk while it is in the cache.

    A body orjson spells otherwise than ``Message.body()`` (a float, a lone surrogate)
    fails its hash here, and the exact path decides it."""
    if not items:
        return None
    messages: list[Message] = []
    prev = None
    for start in range(0, len(items), chunk):
        part = items[start:start + chunk]
        made = _document_part(part, prev)
        if made is None or list(map(attrgetter("seq"), made)) != \
                list(range(start, start + len(part))):
            return None
        messages.extend(made)
        prev = made[-1].hash
    return messages


def _document_part(items: list[Any], prev: str | None) -> list[Message] | None:
    if set(map(type, items)) != {dict}:
        return None
    hashes = list(map(dict.pop, items, repeat("hash"), repeat(_NO_HASH)))
    intact = False
    try:
        present = message_keys(items)
        intact = present is not None and set(map(type, hashes)) == {str} and not any(
            None in map(dict.get, items, repeat(k), repeat(0)) for k in OPTIONAL_FIELDS
            if k in present) and chain_intact(map(_sorted_json, items), hashes, prev)
    finally:  # each hash put back (last, where chatstate writes it)
        if intact:
            deque(map(dict.__setitem__, items, repeat("hash"), hashes), maxlen=0)
        else:
            for item, hash_ in zip(items, hashes, strict=True):
                if hash_ is not _NO_HASH:
                    item["hash"] = hash_
    return Message.from_stored_list(items, present | {"hash"}) if intact and present \
        else None


def canonical(item: dict[str, Any]) -> bytes | None:
    """What ``Message.body()`` would hash for this stored dict, or None if orjson cannot."""
    body = dict(item)
    body.pop("hash", None)
    for k in OPTIONAL_FIELDS:
        if k in body and body[k] is None:
            del body[k]
    try:
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None


def first_break(messages: Sequence[Message], bodies: Iterable[bytes | None],
                prev: str | None = None, start: int = 0, *, exact: bool = False) -> int | None:
    """The first position whose seq or chain hash is wrong, else None.

    ``bodies[i]`` is the canonical JSON of ``messages[i]`` as loaded (None: unknown).
    ``exact``: the bodies are the hashed bytes themselves (sqlite rows), so a
    mismatch is final, with no second opinion from ``Message.body()``.
    """
    for offset, (msg, body) in enumerate(zip(messages, bodies, strict=True)):
        position = start + offset
        if msg.seq != position:
            return position
        ok = False
        if body is not None:
            h = hashlib.sha256((prev or "").encode())
            h.update(body)
            ok = h.hexdigest() == msg.hash
        if not ok and (exact or msg.expected_hash(prev) != msg.hash):
            return position
        prev = msg.hash
    return None
