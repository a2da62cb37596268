"""Forks: a new conversation that starts as a copy of another's first messages.

The copy is verbatim (same seqs, contents, timestamps and therefore the same
hashes), so the fork's chain verifies on its own and its message at ``seq``
provably matches the original's; from there the two diverge. The original is
only read, never written. The fork's metadata records
``forked_from: {id, seq, hash}`` (``seq`` -1 and ``hash`` None for a fork of
nothing, which is how `/edit` of a first message starts).
"""

from __future__ import annotations

from chatstate.core.transcript import Conversation, new_id, validate_id
from chatstate.errors import ConfigurationError, InvalidOption
from chatstate.stores.base import Store


def fork(store: Store, conversation_id: str, *, at: int | None = None,
         new_conversation_id: str | None = None) -> Conversation:
    """Copy messages ``0..at`` (default: all) of ``conversation_id`` into a new conversation.

    Raises ConversationNotFound for an unknown source, ConflictError when the new
    id exists, and ChatstateError for a seq outside the source.
    """
    source = store.load(conversation_id)
    at = source.last_seq if at is None else at
    if not -1 <= at <= source.last_seq:
        raise InvalidOption(f"conversation {conversation_id!r} has seqs 0..{source.last_seq}; "
                            f"cannot fork at {at}. `chatstate replay {conversation_id}` "
                            "shows them")
    copied = source.messages[: at + 1]
    metadata = {k: v for k, v in source.metadata.items() if k != "forked_from"}
    metadata["forked_from"] = {"id": source.id, "seq": at,
                               "hash": copied[-1].hash if copied else None}
    title = f"{source.title} (fork)" if source.title else ""
    new = Conversation(id=validate_id(new_conversation_id) if new_conversation_id
                       else new_id(), title=title, metadata=metadata)
    store.create(new)
    if copied:
        store.append(new.id, copied)
    return store.load(new.id)


def last_user_seq(conversation: Conversation) -> int:
    """The seq of the newest user message; ChatstateError when there is none."""
    for message in reversed(conversation.messages):
        if message.role == "user":
            return message.seq
    raise ConfigurationError(f"conversation {conversation.id!r} has no user message to edit")
