"""An encrypted store: every store, sealed at its record boundary by the AEAD codec.

``open_store`` wraps the store it opened in ``SealedStore`` when a key is
configured (``chatstate.stores.keys``), so json, sqlite, s3, postgresql, memory
and third-party stores are encrypted by this one module, and each keeps its own
layout, compare-and-append, leases and crash recovery unchanged.

What the store holds for a message is itself a valid message: the seq, status
and time in the clear, role ``event``, and as content one ``chatstate.sealed``
part (``"v":2``: the real message's plaintext chain hash and canonical JSON, sealed;
associated data: kind, conversation id, seq, the chain hash before it; a part without
``v`` is format 1, the canonical JSON alone, still read) plus one ``chatstate.blob``
part per blob it names (the
sealed blob's keyed address and size, so the store's blob checks and ``gc`` see
them). The store chains its hashes over those stored bodies, so its chain, and
``replay --verify`` and ``doctor`` without the key, check the ciphertext; the
caller sees the real messages, whose hashes are today's chain over their
plaintext bodies: carried in each record's authenticated plaintext (format 2; the
sealer checked each against its body before sealing it), or recomputed from the bodies
(format 1). ``replay --verify`` with the key recomputes them all.

A title and the metadata are sealed too (kinds ``title`` and ``metadata``). A
blob is sealed with a nonce derived from its bytes, so its address (the sha256
of the sealed bytes, checkable without the key) is a keyed digest: equal files
are stored once under one key, and nobody without the key can confirm a guess.

The store is marked encrypted by a conversation named ``chatstate.encryption``
(its title says so, its metadata names the AEAD and the key's fingerprint),
hidden from callers here; a store with the mark refuses to open without a key.
"""

from chatstate.stores._mark import marker as marker  # the mark's reader, for the drill and tools
from chatstate.stores.sealed._record import chain_of as chain_of
from chatstate.stores.sealed.opening import (
    algorithm_of as algorithm_of,
)
from chatstate.stores.sealed.opening import (
    describe_sealed as describe_sealed,
)
from chatstate.stores.sealed.opening import (
    encryption_note as encryption_note,
)
from chatstate.stores.sealed.opening import (
    is_sealed as is_sealed,
)
from chatstate.stores.sealed.opening import (
    mark_encrypted as mark_encrypted,
)
from chatstate.stores.sealed.opening import (
    seal_opened as seal_opened,
)
from chatstate.stores.sealed.opening import (
    verified_load as verified_load,
)
from chatstate.stores.sealed.store import HIDDEN as HIDDEN
from chatstate.stores.sealed.store import MARKER_TITLE as MARKER_TITLE
from chatstate.stores.sealed.store import SealedStore as SealedStore
