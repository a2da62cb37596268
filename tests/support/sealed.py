"""Helpers for the encrypted-store tests: a key in the environment, raw access to the
sealed records behind the key, damage hooks that edit ciphertext."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chatstate.stores import open_store
from chatstate.stores.keys import VARIABLES
from support.stores import damage_blob, tamper

KEY = "csk1-" + "A" * 42 + "E"  # fixed for tests: 32 bytes, base64url
OTHER_KEY = "csk1-" + "B" * 42 + "E"


@contextmanager
def keyless() -> Iterator[None]:
    """No key variable set inside the block (restored after)."""
    saved = {name: os.environ.pop(name) for name in VARIABLES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def open_raw(url: str) -> Any:
    """The store as it is stored: sealed records, opened without the key."""
    with keyless():
        return open_store(url, keyless=True, allow_ephemeral=url.startswith("memory:"))


def flip_sealed(data: str) -> str:
    """The sealed base64 text with one character of its ciphertext changed (still base64)."""
    i = len(data) // 2
    return data[:i] + ("A" if data[i] != "A" else "B") + data[i + 1:]


class SealedDamageHooks:
    """``StoreContract``'s damage hooks for an encrypted built-in store: the sealed bytes
    are edited behind the key (the chain over the stored bytes then breaks there)."""

    def damage(self, store_url: str, conversation_id: str, seq: int) -> None:
        raw = open_raw(store_url)
        try:
            data = raw.load(conversation_id).messages[seq].content[0]["data"]
            tamper(store_url, raw, conversation_id, seq, (data, flip_sealed(data)))
        finally:
            raw.close()

    def damage_blob(self, store_url: str, sha256: str, how: str) -> None:
        raw = open_raw(store_url)
        try:
            damage_blob(raw, store_url, sha256, how)
        finally:
            raw.close()
