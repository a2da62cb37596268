"""A message's canonical body and its chain hash, made and hashed in pieces when long.

The canonical body is JSON with sorted keys, no whitespace, UTF-8 (``canonical_json``);
a message's ``hash`` is sha256 over the previous message's hash followed by that body
(``chain_hash``). A long reply's text is encoded and hashed a slice at a time, so its
body is never built whole (``LARGE_CONTENT``, ``canonical_pieces``). Nothing here knows
a message's fields: ``chatstate.core.transcript`` builds on it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson


def canonical_json(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


HASH_SLICE = 1 << 20
"""Characters of a body encoded at a time to be hashed."""


LARGE_CONTENT = 1 << 20
"""Characters of text content from which a message's body is made in pieces
(``Message.body_pieces``): a long reply's text is encoded a slice at a time, and
neither the body string, nor the JSON encoder's escaped copy of the text, nor its
encoded bytes are ever built whole (a 50 MB reply is held once, as its text)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def holds_surrogates(text: str) -> bool:
    """Does ``text`` hold UTF-16 surrogates (half characters, which UTF-8 cannot
    encode: JSON's ``"\\ud83d"``, or bytes a file name's decoding escaped)?"""
    return not text.isascii() and _SURROGATE.search(text) is not None


def well_formed(text: str) -> str:
    """``text`` as Unicode text: UTF-16 surrogates that pair up joined into their
    character, a lone one replaced by U+FFFD. A provider's JSON can spell half a
    character (``"\\ud83d"``, or an emoji cut between two stream chunks); no store can
    write that as UTF-8, so a message holding one was refused, and its reply lost."""
    if not holds_surrogates(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def long_text(content: object) -> bool:
    """Text content long enough to be encoded in slices (``LARGE_CONTENT``), holding no
    lone surrogate (orjson refuses those; the plain encoder takes them)."""
    return isinstance(content, str) and len(content) >= LARGE_CONTENT and \
        not holds_surrogates(content)


def text_json(content: str) -> Iterator[bytes]:
    """The JSON string of ``content`` as ``json.dumps(..., ensure_ascii=False)`` writes it,
    UTF-8, a slice at a time (JSON escapes each code point by itself, so the slices'
    escapes are the whole's)."""
    yield b'"'
    for at in range(0, len(content), HASH_SLICE):
        yield orjson.dumps(content[at:at + HASH_SLICE])[1:-1]
    yield b'"'


def split_around(dumped: str, key: str = "content", colon: str = ":"
                 ) -> tuple[bytes, bytes] | None:
    """``dumped`` (JSON holding ``key`` with the value ``""`` once; ``colon`` as it was
    dumped with) cut where that value goes: (before it, after it), UTF-8. None if the
    mark is not there exactly once (a nested one as well: not sure which)."""
    mark = f'"{key}"{colon}""'
    at = dumped.find(mark)
    if at < 0 or dumped.find(mark, at + 1) >= 0:
        return None
    cut = at + len(mark) - 2
    return (dumped[:cut].encode("utf-8", "surrogatepass"),
            dumped[cut + 2:].encode("utf-8", "surrogatepass"))


def json_with_text(data: dict[str, Any], dump: Callable[[dict[str, Any]], str],
                   colon: str = ":") -> Iterator[bytes] | None:
    """``dump(data)`` as UTF-8 slices, its long text ``content`` encoded a slice at a time
    (``text_json``); None when ``data`` holds no such content (dump it whole)."""
    content = data.get("content")
    if not long_text(content):
        return None
    around = split_around(dump({**data, "content": ""}), colon=colon)
    if around is None:
        return None
    assert isinstance(content, str)
    return _around(around, content)


def _around(around: tuple[bytes, bytes], content: str) -> Iterator[bytes]:
    yield around[0]
    yield from text_json(content)
    yield around[1]


def canonical_pieces(data: dict[str, Any]) -> Iterator[bytes]:
    """``canonical_json(data)`` as UTF-8 bytes, in slices (``json_with_text``)."""
    pieces = json_with_text(data, canonical_json)
    return pieces if pieces is not None else \
        iter([canonical_json(data).encode("utf-8", "surrogatepass")])


def chain_hash_pieces(prev_hash: str | None, pieces: Iterable[bytes]) -> str:
    """``chain_hash`` of the body whose UTF-8 bytes are ``pieces`` joined."""
    h = hashlib.sha256()
    h.update((prev_hash or "").encode())
    for piece in pieces:
        h.update(piece)
    return h.hexdigest()


def chain_hash(prev_hash: str | None, body: str) -> str:
    h = hashlib.sha256()
    h.update((prev_hash or "").encode())
    # in slices: a long reply's body is not copied whole once more to be hashed (each code
    # point encodes on its own, so the slices' bytes are the whole body's)
    for at in range(0, len(body), HASH_SLICE):
        h.update(body[at:at + HASH_SLICE].encode("utf-8", "surrogatepass"))
    return h.hexdigest()
