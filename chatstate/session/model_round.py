"""One model round of a turn: call the model, persist, only then hand text over.

Streaming, each piece of text is written as the conversation's partial reply
before it is yielded (group commit: the deltas that arrive during one write go
into the next), and the complete reply is appended into the chain before its
last piece is yielded. Whatever ends the round early (Ctrl-C, a closed
generator, a model error) first keeps everything that arrived as the partial.
Used by the tool loop, which runs one round per model call of a turn.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from chatstate.errors import ChatstateError, ModelError

if TYPE_CHECKING:
    from chatstate.session.chat import Chat

log = logging.getLogger("chatstate.session")


def model_round(chat: Chat, turn_id: str, params: dict[str, Any],
                streaming: bool) -> Generator[str, None, None]:
    """Generator: call the model, persist, then yield."""
    from chatstate.adapter import Completion

    model = params.pop("model", None) or chat.model
    if not streaming:
        done = chat._call(turn_id, model, params, streaming)
        yield commit(chat, turn_id, done, "", model)
        return
    from chatstate.session.stream_flush import GroupCommit

    # While one partial write is in flight the deltas that arrive are coalesced
    # into the next (group commit): text is yielded only once it is durable.
    feed = GroupCommit(chat._call(turn_id, model, params, streaming), chat.flush_interval)
    shown = ""
    try:
        for item in feed:
            if isinstance(item, Completion):
                rest = commit(chat, turn_id, item, shown, model)
                shown = feed.arrived()  # committed whole: nothing is left to keep as partial
                if rest:
                    yield rest
                return
            assert isinstance(item, str)
            save_partial(chat, turn_id, item, model)
            out, shown = item[len(shown):], item
            yield out
        raise ModelError("the model stream ended without a final completion",
                         retryable=True)
    except BaseException:
        # Ctrl-C, a closed generator or a model error: keep what arrived, then let it go.
        arrived = feed.arrived()
        if len(arrived) > len(shown):
            save_partial(chat, turn_id, arrived, model, quiet=True)
        raise
    finally:
        feed.close()

def save_partial(chat: Chat, turn_id: str, text: str, model: str | None,
                 quiet: bool = False) -> None:
    partial = chat._seal(role="assistant", content=text, turn_id=turn_id,
                         status="partial", model=model)
    try:
        chat.store.save_partial(chat.id, partial)
    except ChatstateError as exc:
        if not quiet:
            raise
        log.warning("%s: could not keep the interrupted reply (%d chars at seq %d) as a "
                    "partial: %s", chat.id, len(text), partial.seq, exc)
        return
    chat.conversation.partial = partial

def commit(chat: Chat, turn_id: str, done: Any, shown: str = "",
           requested: str | None = None) -> str:
    """Append the complete reply; return the part of it not yet yielded."""
    finish = done.finish_reason if done.finish_reason not in (None, "stop") else None
    reply = chat._seal(role="assistant", content=done.text, turn_id=turn_id,
                       model=done.model, usage=done.usage, finish_reason=finish,
                       requested_model=requested if requested != done.model else None,
                       tool_calls=getattr(done, "tool_calls", None),
                       extra=getattr(done, "extra", None))
    chat._append([reply])
    if done.text.startswith(shown):
        return str(done.text[len(shown):])
    note_divergent(chat, reply.seq, len(shown))
    return ""

def note_divergent(chat: Chat, seq: int, shown_chars: int) -> None:
    """The final reply does not extend what was shown: say so, and keep the fact."""
    log.warning("%s: the final reply at seq %d does not extend the %d chars already shown; "
                "the stored reply is the final one (see `chatstate replay`)", chat.id, seq,
                shown_chars)
    metadata = dict(chat.conversation.metadata)
    metadata["divergent_replies"] = [*metadata.get("divergent_replies", []),
                                     {"seq": seq, "shown_chars": shown_chars}]
    try:
        chat.store.set_header(chat.id, metadata=metadata)
    except ChatstateError as exc:  # the reply is stored; only the note is missing
        log.warning("%s: could not record the divergent reply in the metadata: %s",
                    chat.id, exc)
        return
    chat.conversation.metadata = metadata
