"""Base64 for sealed records, which every sealed append writes and every load reads:
pybase64's SIMD codec when it is installed (``chatstate[crypto]`` brings it: about
four times as fast as ``binascii`` on a record, a quarter of an encrypted json load),
else the standard library's. Both make the same bytes, and both refuse a character
outside the alphabet (``binascii.Error``, a ValueError)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], str], Callable[[bytes | str], bytes]]


def standard() -> Codec:
    """(encode, encode to text, decode) of the standard library."""

    def encode(data: bytes) -> bytes:
        return binascii.b2a_base64(data, newline=False)

    def encode_text(data: bytes) -> str:
        return binascii.b2a_base64(data, newline=False).decode("ascii")

    def decode(data: bytes | str) -> bytes:
        return base64.b64decode(data, validate=True)

    return encode, encode_text, decode


def _best() -> Codec:
    try:
        import pybase64
    except ModuleNotFoundError:
        return standard()
    b64decode = pybase64.b64decode

    def decode(data: bytes | str) -> bytes:
        return b64decode(data, validate=True)

    return pybase64.b64encode, pybase64.b64encode_as_string, decode


encode, encode_text, decode = _best()
"""``encode(data)``: base64 bytes; ``encode_text(data)``: the same as text;
``decode(data)``: the bytes of base64 ``data`` (``binascii.Error`` if it is not)."""
