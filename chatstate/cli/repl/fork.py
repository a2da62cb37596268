"""The REPL's /compact, /fork and /edit: each a thin call into the library."""

from __future__ import annotations

from typing import Any


class ForkCommands:
    """Mixed into the REPL, which provides ``chat``, ``say`` and ``render``."""

    chat: Any

    def say(self, text: str) -> None: ...  # pragma: no cover - provided by the REPL

    def render(self, streamer: Any, sender: Any) -> None: ...  # pragma: no cover

    def do_compact(self, _: str) -> None:
        from chatstate.session.compact import compact, plan

        if plan(self.chat.conversation, 2) is None:  # before saying it will summarise
            self.say("nothing to compact yet: the last turns are always sent word for word")
            return
        self.say("summarising the older turns…")
        summary = compact(self.chat)
        if summary is None:  # another writer compacted meanwhile
            self.say("nothing to compact yet: the last turns are always sent word for word")
            return
        covers = (summary.params or {})["summary"]["covers_to_seq"]
        self.say(f"summary stored at seq {summary.seq}; it stands in for seqs up to {covers} "
                 "in later requests (they stay in the store):")
        self.say(summary.text)

    def do_fork(self, _: str) -> None:
        self._switch_to_fork(None)

    def do_edit(self, text: str) -> None:
        """Ask again with ``text`` in place of the last user message, in a fork; the
        message's attachments (images, files, text files) go with the new text."""
        from chatstate.core.content import is_attachment
        from chatstate.ops.fork import last_user_seq

        seq = last_user_seq(self.chat.conversation)
        (old,) = [m for m in self.chat.conversation.messages if m.seq == seq]
        kept = [part for part in old.content if is_attachment(part)] \
            if isinstance(old.content, list) else []
        self._switch_to_fork(seq - 1)
        if kept:
            self.say(f"the edited message keeps its {len(kept)} attachment"
                     f"{'s' if len(kept) > 1 else ''}")
        self.render(lambda: self.chat.stream(text, attach=kept),
                    lambda: self.chat.send(text, attach=kept))

    def _switch_to_fork(self, at: int | None) -> None:
        from chatstate.ops.fork import fork

        old = self.chat.id
        new = fork(self.chat.store, old, at=at)
        self.chat.id = new.id
        self.chat.reload()
        seq = new.metadata["forked_from"]["seq"]
        self.say(f"forked {old} at seq {seq}: now in {new.id} ({old} is unchanged)")
