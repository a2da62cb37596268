"""Chat: a conversation's turns, in the order persist -> call -> persist -> render.

A turn: seal and append the user message (durable before the request leaves),
call the model with the whole transcript, append the reply, and only then hand
text to the caller. While streaming, deltas go into the store's partial reply
first and are yielded after ``save_partial`` returns, so whatever a caller has
shown is a prefix of what is stored. Every write is made by the conversation's
turn writer (chatstate.session.turn_writer), which also holds the writer lease
and stops the turn with ``LeaseLost`` when another writer takes it over.

Opening a conversation is recovery: a trailing user message without a reply, a
stored partial reply, or a committed partial with no complete reply after it is
an *interrupted turn*, exposed as ``chat.interrupted``; ``retry()`` completes it
under the same turn id. A partial reply is never dropped: before a new reply is
written for that turn (or a new turn starts) it is committed into the chain with
status ``partial``.

A new message after an interrupted turn is allowed: the unanswered turn stays in
the transcript but is left out of what is sent, so the model always sees user and
assistant alternating (strict chat templates reject two user messages in a row).
A reply the model stopped early (``finish_reason`` "length" or "content_filter")
is stored complete, with its finish reason; ``retry()`` then asks the model to
continue, as a new turn.

Two writers on one conversation: appends are compare-and-append, so a writer
whose view is stale loses and reloads. If the other writer's turn is complete
it places its turn after it; if that turn is half done (no complete reply
yet) it raises ConflictError and writes nothing, never splitting the turn. A
partial reply is settled only if the store still holds exactly that partial:
one that changed since it was loaded belongs to a live writer.

With ``tools=[...]`` a turn runs the tool loop (chatstate.session.tool_loop): a turn
whose calls lack results, or whose results have no reply after them, is
interrupted too, and ``interrupted.pending_calls`` names the calls.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from chatstate.core.transcript import Conversation, Message, new_id, new_turn_id, validate_id
from chatstate.errors import (
    ConfigurationError,
    ConflictError,
    ConversationNotFound,
    LeaseLost,
    ModelError,
    Unsupported,
)
from chatstate.session import tool_loop as toolloop
from chatstate.session.sendable import CONTINUE_PROMPT, sendable, storable
from chatstate.session.turn_state import Interrupted as Interrupted
from chatstate.session.turn_state import cut_short_reply, interrupted_turn, user_of
from chatstate.session.turn_writer import TurnWriter
from chatstate.session.writer_lease import Held
from chatstate.stores.base import LEASE_TERM, BlobStore, PacesPartials, Store

if TYPE_CHECKING:
    from chatstate.adapter import ModelAdapter

log = logging.getLogger("chatstate.session")


class Chat:
    """A conversation bound to a store and a stateless model adapter.

    ``store`` is a Store or a store URL; ``adapter`` a ModelAdapter, else one is
    made from ``model``/``base_url``/``api_key``/``client``/``api`` (the wire API:
    ``chat_completions``, ``responses`` or ``anthropic_messages``) and the settings.
    ``conversation_id`` continues that conversation or creates it on first send.
    """

    def __init__(self, store: Store | str | None = None, *,
                 conversation_id: str | None = None, model: str | None = None,
                 adapter: ModelAdapter | None = None, system: str | None = None,
                 title: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, client: Any = None,
                 params: Mapping[str, Any] | None = None,
                 flush_interval: float | None = None, allow_ephemeral: bool = False,
                 context_window: int | None = None, max_tool_rounds: int = 8,
                 on_tool: Callable[[Message], None] | None = None, lease_wait: float = 0.0,
                 lease_term: float = LEASE_TERM, api: str | None = None) -> None:
        if store is None or isinstance(store, str):
            from chatstate.stores import open_store

            self.store: Store = open_store(store, allow_ephemeral=allow_ephemeral)
        else:
            self.store = store
        if adapter is None:
            from chatstate.adapter import make_adapter

            adapter = make_adapter(model=model, base_url=base_url, api_key=api_key,
                                   client=client, api=api)
        self.adapter: ModelAdapter = adapter
        self.model: str | None = model or getattr(adapter, "model", None)
        self.params: dict[str, Any] = dict(params or {})
        self.max_tool_rounds = max_tool_rounds
        self.on_tool = on_tool
        """Called with each tool-call message and each tool result, once it is stored."""
        if flush_interval is None:
            paced = self.store
            flush_interval = paced.partial_flush_interval if isinstance(
                paced, PacesPartials) else 0.0
        self.flush_interval = float(flush_interval)
        self.id = validate_id(conversation_id) if conversation_id else new_id()
        self.context_window = context_window  # None: learned, else the built-in table
        self.last_fit: Any = None  # what the last request sent (context.Fit)
        self.unlogged = False  # True for a copy whose turns are not stored (unlogged.py)
        self._title = title
        self._system = system
        # the writer lease (see writer_lease): a second writer waits lease_wait seconds,
        # then gets ConversationInUse; this Chat re-takes its own lease at once
        self.lease_wait, self.lease_term = lease_wait, lease_term
        self._lease_owner = new_id()
        self._writer: TurnWriter | None = None
        self.reload()

    # -- state -----------------------------------------------------------------------
    def reload(self) -> Conversation:
        """Read the conversation (``id``) from the store again."""
        try:
            conv, created = self.store.load(self.id), True
        except ConversationNotFound:
            conv, created = Conversation(id=self.id, title=self._title or ""), False
        if self._writer is None or self._writer.id != self.id:  # `chat.id = ...` switched
            self._writer = TurnWriter(self.store, conv, created=created,
                                      owner=self._lease_owner)
        else:  # the same writer: a turn holding the lease goes on holding it
            self._writer.conversation, self._writer.created = conv, created
        return conv

    @property
    def writer(self) -> TurnWriter:
        """The turn writer of this conversation: every write goes through it."""
        if self._writer is None or self._writer.id != self.id:
            self.reload()
        assert self._writer is not None
        return self._writer

    @property
    def conversation(self) -> Conversation:
        return self.writer.conversation

    @conversation.setter
    def conversation(self, value: Conversation) -> None:
        self.writer.conversation = value

    @property
    def messages(self) -> list[Message]:
        return self.conversation.messages

    @property
    def interrupted(self) -> Interrupted | None:
        """The turn left without a complete reply, if the conversation ends in one."""
        return interrupted_turn(self.conversation)

    @property
    def cut_short(self) -> Message | None:
        """The last reply, if the model stopped it early (token limit, content filter)."""
        return cut_short_reply(self.conversation)

    def _ensure_created(self) -> None:
        writer = self.writer
        if writer.created:
            return
        if not writer.create():  # someone created it meanwhile: continue theirs
            self.reload()
            self._refuse_half_done_turn()
        if self._system and not self.conversation.messages:
            writer.append([writer.seal(role="system", content=self._system,
                                       turn_id=new_turn_id())])

    def _append_user(self, text: str | list[dict[str, Any]],
                     params: dict[str, Any]) -> Message:
        """Append the user's message; on a conflict, go after the other writer's whole turn."""
        writer = self.writer
        for attempt in (1, 2):
            msg = writer.seal(role="user", content=text, turn_id=new_turn_id(),
                              params=storable(params) or None)
            try:
                writer.append([msg])
                return msg
            except LeaseLost:
                raise  # another writer has the conversation now: stop
            except ConflictError:
                self.reload()
                if attempt == 2 or self.interrupted is not None:
                    raise  # never put our turn into the middle of another writer's turn
        raise AssertionError("unreachable")

    def _refuse_half_done_turn(self) -> None:
        """Called after another writer moved the conversation on: never split its turn."""
        turn = self.interrupted
        if turn is not None:
            raise ConflictError(
                f"conversation {self.id!r} changed meanwhile and another writer's turn is "
                f"not finished ({turn.describe()}); nothing was written. Reload and try "
                "again once it is done, or retry() it.")

    def _settle_partial(self) -> None:
        """Commit a stored partial reply into the chain so it is kept, visibly, as partial
        (see TurnWriter.settle_partial); refuse to split another writer's unfinished turn."""
        if not self.writer.settle_partial():
            self._refuse_half_done_turn()  # else that writer finished it: nothing to keep

    # -- public API --------------------------------------------------------------------
    def send(self, text: str | list[dict[str, Any]], *, attach: Iterable[Any] = (),
             tools: Iterable[Any] | None = None, **params: Any) -> Message:
        """One turn, not streamed. Returns the reply, already durable.

        ``text`` is a string or a list of content parts (see ``chatstate.core.content``);
        ``attach`` adds images and files (paths, URLs, bytes or parts). ``tools``:
        functions (or ``@chatstate.tool``s) the model may call; the turn runs the tool
        loop until a reply without calls (see chatstate.session.tool_loop).
        """
        return self._consume(self._turn(text, params, streaming=False, attach=attach,
                                        tools=tools))

    def stream(self, text: str | list[dict[str, Any]], *, attach: Iterable[Any] = (),
               tools: Iterable[Any] | None = None, **params: Any) -> Generator[str, None, None]:
        """One streamed turn. Each delta is durable in the store before it is yielded."""
        return self._turn(text, params, streaming=True, attach=attach, tools=tools)

    def retry(self, *, tools: Iterable[Any] | None = None, **params: Any) -> Message:
        """Complete the interrupted turn under the same turn id (no second user message).

        With no interrupted turn but a reply cut short (``cut_short``), ask the
        model to continue it: a new turn whose message is ``CONTINUE_PROMPT``.

        Pending tool calls are run with ``tools`` first, except a non-idempotent one
        that may have started: it is answered "outcome unknown" and not run again.
        """
        return self._consume(self._retry(params, streaming=False, tools=tools))

    def retry_stream(self, *, tools: Iterable[Any] | None = None,
                     **params: Any) -> Generator[str, None, None]:
        return self._retry(params, streaming=True, tools=tools)

    # Outside a turn no lease is held: these writes are unfenced (compare-and-append
    # still decides between two writers), as they were before fencing.
    def set_title(self, title: str) -> None:
        self._ensure_created()
        self.writer.set_title(title)

    def add_system(self, text: str, *, params: dict[str, Any] | None = None) -> Message:
        """Append a system message (a new instruction from here on; a summary if marked)."""
        self._ensure_created()
        self._settle_partial()
        msg = self.writer.seal(role="system", content=text, turn_id=new_turn_id(),
                               params=params)
        self.writer.append([msg])
        return msg

    # -- the turn ----------------------------------------------------------------------
    def _consume(self, gen: Iterator[str]) -> Message:
        for _ in gen:
            pass
        last = self.conversation.last
        assert last is not None and last.role == "assistant"
        return last

    def _turn(self, text: str | list[dict[str, Any]], params: dict[str, Any], *,
              streaming: bool, attach: Iterable[Any] = (),
              tools: Iterable[Any] | None = None) -> Generator[str, None, None]:
        body = _user_content(text, attach)
        if tools is not None:  # two tools of one name: refused before anything is stored
            from chatstate.core.tools import toolset

            tools = list(toolset(tools).values())  # made once: the loop takes them as made
        held = self._hold()
        try:
            self._ensure_created()
            # calls left pending by an interrupted turn get results
            toolloop.abandon(self.writer, self._notify)
            self._settle_partial()
            merged = {**self.params, **params}
            user = self._append_user(self._store_blobs(body), merged)
            if not self.conversation.title and self._title is None:
                self._auto_title(user.text or _first_name(body))
        except BaseException:
            self.writer.release(held)
            raise
        return self._held(held, self._reply(user.turn_id, merged, streaming, tools))

    def _hold(self) -> Held:
        """Take the writer lease before the turn writes anything (ConversationInUse)."""
        writer = self.writer
        writer.lease_term, writer.lease_wait = self.lease_term, self.lease_wait
        return writer.hold()

    def _held(self, held: Held, gen: Generator[str, None, None]) -> Generator[str, None, None]:
        writer = self.writer

        def run() -> Generator[str, None, None]:
            try:
                yield from gen
            finally:
                writer.release(held)

        turn = run()
        # A stream dropped before its first step never runs its finally: release then too.
        weakref.finalize(turn, held.release)
        return turn

    def _retry(self, params: dict[str, Any], *, streaming: bool,
               tools: Iterable[Any] | None = None) -> Generator[str, None, None]:
        if self.interrupted is None:
            cut = self.cut_short
            if cut is not None:
                user = user_of(self.conversation, cut.turn_id)
                return self._turn(CONTINUE_PROMPT, {**(user.params or {} if user else {}),
                                                    **params}, streaming=streaming, tools=tools)
            raise ConfigurationError(f"conversation {self.id!r} has no interrupted turn to retry")
        held = self._hold()
        try:
            self._settle_partial()
            turn = self.interrupted
            if turn is None:  # the settle reloaded: another writer completed the turn
                raise ConflictError(f"conversation {self.id!r}: another writer completed the "
                                    "interrupted turn meanwhile; there is nothing to retry")
        except BaseException:
            self.writer.release(held)
            raise
        merged = {**self.params, **(turn.user_message.params or {} if turn.user_message
                                    else {}), **params}
        return self._held(held, self._reply(turn.turn_id, merged, streaming, tools))

    def _auto_title(self, text: str) -> None:
        title = " ".join(text.split())[:60]
        if title:
            self.writer.set_title(title)

    def _history(self, turn_id: str, model: str | None = None,
                 params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        # Complete messages only (the model never sees a cut-off reply as its final
        # words; tool results that failed (error) or may not have run (unknown) it must
        # see), less unanswered user messages of earlier failed turns (strict chat
        # templates reject two user messages in a row), fitted to the context window
        # (the fit is kept as self.last_fit), and never a call without its result or a
        # result without its call.
        from chatstate.session.context import keep_reference, request_for

        _, left_out = sendable(self.conversation.messages, turn_id, keep_reference)
        if left_out:
            log.info("%s: not sending unanswered user message(s) at seq %s", self.id,
                     ", ".join(map(str, left_out)))
        return toolloop.well_formed(request_for(self, model, params, exclude=left_out,
                                                blob=self._inline_blob))

    def _call(self, turn_id: str, model: str | None, params: dict[str, Any],
              streaming: bool) -> Any:
        """The adapter call, refitted and retried once if the provider names its window."""
        from chatstate.session.context import alone_too_big, call_fitted, learn, peek

        def call(history: list[dict[str, Any]]) -> Any:
            if streaming:
                return peek(self.adapter.stream(history, model=model, params=params or None))
            return self.adapter.complete(history, model=model, params=params or None)
        try:
            return call_fitted(lambda: self._history(turn_id, model, params), call,
                               lambda window, prompt: learn(
                                   self.writer, self.context_window, model, window, prompt,
                                   self.last_fit.tokens if self.last_fit else None))
        except ModelError as exc:
            better = alone_too_big(exc, self.last_fit, turn_id)
            if better is None:
                raise
            raise better from exc

    def _store_blobs(self, content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        """Large images and files go to the store's blob area, durably, before the message."""
        from chatstate.core.content import store_parts

        return store_parts(self.store, content)

    def _inline_blob(self, part: dict[str, Any]) -> dict[str, Any]:
        """A stored part's blob as a data URL for the request (digest checked)."""
        from chatstate.core.content import inline_part

        if not isinstance(self.store, BlobStore):
            raise Unsupported(f"{self.store.url}: conversation {self.id!r} names a blob, "
                                 "but this store has no blob area to read it from")
        return inline_part(part, self.store.get_blob(part["blob"]["sha256"]))

    def _reply(self, turn_id: str, params: dict[str, Any], streaming: bool,
               tools: Iterable[Any] | None) -> Generator[str, None, None]:
        """Generator: the turn's model and tool rounds, written through the turn writer."""
        return toolloop.drive(self.writer, _ChatModel(self), turn_id, params, streaming, tools,
                              max_rounds=self.max_tool_rounds, on_tool=self._notify)

    def _notify(self, message: Message) -> None:
        if self.on_tool is not None:
            self.on_tool(message)


class _ChatModel:
    """Chat's model side of a round (a ModelCaller): the adapter call, context fitted."""

    def __init__(self, chat: Chat) -> None:
        self._chat = chat

    @property
    def model(self) -> str | None:
        return self._chat.model

    @property
    def flush_interval(self) -> float:
        return self._chat.flush_interval

    def call(self, turn_id: str, model: str | None, params: dict[str, Any],
             streaming: bool) -> Any:
        return self._chat._call(turn_id, model, params, streaming)


def _user_content(text: str | list[dict[str, Any]],
                  attach: Iterable[Any]) -> str | list[dict[str, Any]]:
    if isinstance(text, str) and not attach:
        return text  # the plain-text turn needs no import
    from chatstate.core.content import content

    return content(text, attach)


def _first_name(content: str | list[dict[str, Any]]) -> str:
    """A title for a turn without text: the first attachment's name."""
    for part in content if isinstance(content, list) else ():
        name = part.get("name") or (part.get("file") or {}).get("filename")
        if name:
            return str(name)
    return ""
