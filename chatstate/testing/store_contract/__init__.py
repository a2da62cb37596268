"""The store contract as test classes: a store, chatstate's or yours, joins with one fixture.

    import pytest
    from chatstate.stores import register
    from chatstate.testing.store_contract import StoreContract

    register("mystore", "mypackage.store:MyStore")

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store_url(self, tmp_path):
            return f"mystore://{tmp_path}/store"   # a fresh, empty store for each case

Every case opens ``store_url`` with ``chatstate.stores.open_store``, so the durability
guard runs first. A subclass may set:

- ``allow_ephemeral = True`` for a store the guard calls ephemeral (``memory://``, tmpfs);
- ``keyed_blob_addresses = True`` for an encrypted store (blob addresses are keyed digests);
- ``in_process = True`` when the state lives in the test process (``memory://``): the
  crash cases then reopen within the process; otherwise a child process writes and is
  killed with SIGKILL (it opens the store again from its URL, so the store's class must
  be importable: a module-level class, registered in a module the child can import);
- ``damage(store_url, conversation_id, seq)`` and ``damage_blob(store_url, sha256, how)``:
  hooks that damage stored data behind the store's back, for the cases proving damage
  is refused and never written over. Without them those cases skip, saying why.

The optional parts are tested when the store has them (``isinstance`` against the
protocols of ``chatstate.stores.base``) and skipped, saying so, when it has not: the
blob cases need ``BlobStore``, the lease and fencing cases ``Leases``. The mixins
(``ConversationCases``, ``AppendCases``...) may also be joined one by one.

Needs only pytest and chatstate. Running this package (``python -m``) is the child
writer of the crash and race cases.
"""

from __future__ import annotations

from chatstate.testing.store_contract._appends import AppendCases, PartialCases
from chatstate.testing.store_contract._base import (
    StoreCase,
    new_conversation,
    seal_chain,
)
from chatstate.testing.store_contract._blobs import BlobCases
from chatstate.testing.store_contract._conversations import ConversationCases
from chatstate.testing.store_contract._crashes import CrashCases
from chatstate.testing.store_contract._damage import DamageCases, RewriteCases
from chatstate.testing.store_contract._leases import CreateLeasedCases, FencingCases

__all__ = ["AppendCases", "BlobCases", "ConversationCases", "CrashCases", "CreateLeasedCases",
           "DamageCases", "FencingCases", "PartialCases", "RewriteCases", "StoreCase",
           "StoreContract", "new_conversation", "seal_chain"]



class StoreContract(ConversationCases, AppendCases, PartialCases, CrashCases, FencingCases,
                    CreateLeasedCases, BlobCases, DamageCases):
    """Every case of the store contract. Subclass it and provide a ``store_url`` fixture."""

