"""The shipped store contract on every store with the AEAD codec (a key configured).

One encrypted class per store kind keeps the suite's time: json, sqlite, s3 (moto) and
postgresql through conftest's ``store_url``, and memory://, each run by the same cases
as their plain classes in test_store_contract.py, with the records sealed.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import pytest
from support.sealed import KEY, SealedDamageHooks, flip_sealed

from chatstate.stores.memory.store import MemoryStore
from chatstate.testing.store_contract import StoreContract


class _Keyed:
    keyed_blob_addresses = True

    def blob_address(self, store: Any, data: bytes) -> str:
        return hashlib.sha256(store.codec.seal_blob(data)).hexdigest()

    @pytest.fixture(autouse=True)
    def _encryption_key(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CHATSTATE_ENCRYPTION_KEY", KEY)


class TestEncryptedBuiltinStores(_Keyed, SealedDamageHooks, StoreContract):
    """json, sqlite, s3 (moto) and postgresql, encrypted."""


class TestEncryptedMemoryStore(_Keyed, StoreContract):
    """memory://, encrypted."""

    allow_ephemeral = True
    in_process = True

    @pytest.fixture
    def store_url(self) -> str:
        return f"memory://contract-sealed-{secrets.token_hex(6)}"

    def _space(self, store_url: str) -> Any:
        return MemoryStore.from_url(store_url).space

    def damage(self, store_url: str, conversation_id: str, seq: int) -> None:
        held = self._space(store_url).conversations[conversation_id]
        messages = list(held.messages)
        parts = [dict(p) for p in messages[seq].content]
        parts[0]["data"] = flip_sealed(parts[0]["data"])
        messages[seq] = messages[seq].model_copy(update={"content": parts})
        held.messages = tuple(messages)

    def damage_blob(self, store_url: str, sha256: str, how: str) -> None:
        blobs = self._space(store_url).blobs
        data, stored_at = blobs[sha256]
        blobs[sha256] = (data[:1000] if how == "truncated" else b"X" + data[1:], stored_at)
