"""Compaction: the model summarises the older turns; later requests send the summary.

The summary is appended as a system message whose ``params`` carry
``{"summary": {"covers_to_seq": S}}``. Nothing is removed or rewritten: the
turns it covers stay in the chain (``replay`` shows them), and
``context.fit`` sends the newest summary in their place. The newest
``keep_turns`` turns are never summarised, so the conversation's thread is
sent word for word.
"""

from __future__ import annotations

from typing import Any

from chatstate.core.transcript import Conversation, Message
from chatstate.session import context

PROMPT = ("Summarise the conversation so far for your own later use. Keep the facts, "
          "decisions, names, numbers, code and open questions; drop pleasantries. Write "
          "only the summary.")


def plan(conversation: Conversation, keep_turns: int) -> tuple[list[Message], int] | None:
    """(messages to summarise, the last seq they cover), or None when there is too little."""
    current = context.fit(conversation, None)
    body = [m for m in current.messages if m.role != "system"]
    groups = context.turns(body)
    if len(groups) <= keep_turns:
        return None
    older = [m for group in groups[: len(groups) - keep_turns] for m in group]
    previous = [current.summary] if current.summary is not None else []
    return previous + older, older[-1].seq


def compact(chat: Any, *, keep_turns: int = 2) -> Message | None:
    """Have ``chat``'s model summarise all but the newest ``keep_turns`` turns; store it.

    Returns the stored summary message, or None when there was nothing to compact.
    """
    work = plan(chat.conversation, keep_turns)
    if work is None:
        return None
    messages, covers = work
    window = context.resolve_window(chat.context_window, chat.conversation.metadata, chat.model)
    ask = Conversation(id=chat.id, messages=[*messages])
    inline = getattr(chat, "_inline_blob", None)
    request = [m.to_openai(blob=inline) for m in context.fit(ask, window).messages]
    request.append({"role": "user", "content": PROMPT})
    done = chat.adapter.complete(request, model=chat.model)
    # the summary's own cost is kept with it, so `chatstate usage` counts it too
    summary: Message = chat.add_system(done.text, params={"summary": {
        "covers_to_seq": covers, "model": done.model, "usage": done.usage}})
    return summary
