"""One model round of a turn: call the model, persist, only then hand text over.

Streaming, each piece of text is written as the conversation's partial reply
before it is yielded (group commit: the deltas that arrive during one write go
into the next), and the complete reply is appended into the chain before its
last piece is yielded. Whatever ends the round early (Ctrl-C, a closed
generator, a model error) first keeps everything that arrived as the partial;
a lost writer lease (``LeaseLost``) ends it with nothing more written or yielded.
Every write goes through the turn writer (chatstate.session.turn_writer). Used by
the tool loop, which runs one round per model call of a turn.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any, Protocol

from chatstate.errors import LeaseLost, ModelError
from chatstate.session.turn_writer import TurnWriter

log = logging.getLogger("chatstate.session")


class ModelCaller(Protocol):
    """The model side of a round: the adapter call with context fitting.

    ``model`` is the default model; ``flush_interval`` the minimum spacing of
    partial writes (the group commit's ceiling). ``call`` returns a Completion, or
    when ``streaming`` an iterator of text deltas ending in one Completion.
    """

    @property
    def model(self) -> str | None: ...

    @property
    def flush_interval(self) -> float: ...

    def call(self, turn_id: str, model: str | None, params: dict[str, Any],
             streaming: bool) -> Any: ...


def model_round(writer: TurnWriter, caller: ModelCaller, turn_id: str, params: dict[str, Any],
                streaming: bool) -> Generator[str, None, None]:
    """Generator: call the model, persist, then yield."""
    from chatstate.adapter import Completion

    model = params.pop("model", None) or caller.model
    if not streaming:
        done = caller.call(turn_id, model, params, streaming)
        yield writer.commit(turn_id, done, "", model)
        return
    from chatstate.session.stream_flush import GroupCommit

    # While one partial write is in flight the deltas that arrive are coalesced
    # into the next (group commit): text is yielded only once it is durable.
    feed = GroupCommit(caller.call(turn_id, model, params, streaming), caller.flush_interval)
    shown = ""
    try:
        for item in feed:
            if isinstance(item, Completion):
                rest = writer.commit(turn_id, item, shown, model)
                shown = feed.arrived()  # committed whole: nothing is left to keep as partial
                if rest:
                    yield rest
                return
            assert isinstance(item, str)
            writer.save_partial(turn_id, item, model)
            out, shown = item[len(shown):], item
            yield out
        raise ModelError("the model stream ended without a final completion",
                         retryable=True)
    except LeaseLost:
        raise  # another writer has the conversation: nothing more is written
    except BaseException:
        # Ctrl-C, a closed generator or a model error: keep what arrived, then let it go.
        arrived = feed.arrived()
        if len(arrived) > len(shown):
            writer.save_partial(turn_id, arrived, model, quiet=True)
        raise
    finally:
        feed.close()
