"""The tool loop: persist the calls, run the tools, persist the results, call again.

Order, always (each step is one compare-and-append, so two writers never
both win a step):

1. the assistant message with its ``tool_calls`` is committed like any reply;
2. before a non-idempotent tool runs, a "started" marker is appended: a
   ``tool`` message for that call with status ``partial`` and content
   ``started``. It goes into the chain, not the partial slot, so it is a
   compare-and-append too: of two writers completing the same turn at once,
   only one can mark the call started, so only one runs it;
3. the tool runs and its result is appended as a ``tool`` message (status
   ``complete``, or ``error`` when the tool raised, is unknown, or its
   arguments do not fit);
4. only when every call of the message has its result is the model called
   again.

A killed process leaves a call without a result: an interrupted turn
(``pending_calls``). Completing it runs a call again unless it is
non-idempotent and its marker says it may have started; then the result is
status ``unknown`` and says so, and the model is told. A marker is never
sent to a model (it is ``partial``), and ``well_formed`` guards every
request: a call without its result, or a result without its call, never
reaches a model.

Every step is written through the turn writer (chatstate.session.turn_writer),
and the model is called through a ``ModelCaller`` (chatstate.session.model_round).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from chatstate.core.content import Part, store_parts
from chatstate.core.fields import Status
from chatstate.core.tools import _CALL_ID, Tool, ToolOutput, toolset
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ToolLoopError
from chatstate.session.model_round import ModelCaller, model_round
from chatstate.session.turn_writer import TurnWriter

OnTool = Callable[[Message], None]

log = logging.getLogger("chatstate.tools")

UNKNOWN = "interrupted: the tool may or may not have run; it was not run again"
ABANDONED = ("interrupted: the turn was left unfinished and a new message sent; the tool "
             "may or may not have run")


@dataclass(frozen=True)
class PendingCall:
    """A tool call of the conversation's last assistant message that has no result yet."""

    call: dict[str, Any]
    turn_id: str
    started: bool
    """A "started" marker is stored: the tool may have run (or be running elsewhere)."""

    @property
    def id(self) -> str:
        return str(self.call["id"])

    @property
    def name(self) -> str:
        return str(self.call["function"]["name"])


def calls_message(conv: Conversation) -> Message | None:
    """The last assistant message with tool calls, if only ``tool`` messages follow it."""
    for msg in reversed(conv.messages):
        if msg.role == "tool":
            continue
        return msg if msg.role == "assistant" and msg.tool_calls else None
    return None


def pending_calls(conv: Conversation) -> list[PendingCall]:
    """The calls still waiting for a result, in the order the model made them."""
    asking = calls_message(conv)
    if asking is None or asking.tool_calls is None:
        return []
    after = conv.messages[asking.seq + 1:]
    answered = {m.tool_call_id for m in after if m.status != "partial"}
    started = {m.tool_call_id for m in after if m.status == "partial"}
    return [PendingCall(call, asking.turn_id, call["id"] in started)
            for call in asking.tool_calls if call["id"] not in answered]


def drive(writer: TurnWriter, caller: ModelCaller, turn_id: str, params: dict[str, Any],
          streaming: bool, tools: Iterable[Any] | None, *, max_rounds: int = 8,
          on_tool: OnTool | None = None) -> Generator[str, None, None]:
    """The whole turn from here: model rounds and tool rounds until a reply without calls.

    ``on_tool`` is called with each tool-call message and each tool result, once stored.
    """
    by_name = toolset(tools)
    if by_name:
        params = {**params, "tools": [t.spec() for t in by_name.values()]}
    rounds = 0
    while True:
        pending = pending_calls(writer.conversation)
        if pending:
            if rounds >= max_rounds:
                _answer_all(writer, pending, f"not run: stopped after max_tool_rounds="
                            f"{max_rounds}", on_tool)
                raise ToolLoopError(
                    f"conversation {writer.id!r}, turn {turn_id}: the model asked for tools "
                    f"in more than {max_rounds} rounds, so the loop stopped (its "
                    "last calls are answered 'not run'). Raise max_tool_rounds, or "
                    "chat.retry(tools=...) to let it go on.", turn_id=turn_id, rounds=rounds)
            rounds += 1
            for call in pending:
                run_call(writer, call, by_name.get(call.name), by_name, on_tool)
            continue
        last = writer.conversation.last
        if last is not None and last.role == "assistant" and last.status == "complete" \
                and last.turn_id == turn_id and not last.tool_calls:
            return
        yield from model_round(writer, caller, turn_id, dict(params), streaming)
        last = writer.conversation.last
        if last is not None and last.tool_calls and on_tool is not None:
            on_tool(last)


def run_call(writer: TurnWriter, pending: PendingCall, tool: Tool | None,
             available: dict[str, Tool], on_tool: OnTool | None = None) -> Message:
    """Steps 2 and 3 for one call: marker, run, append the result. Returns the result."""
    if pending.started and (tool is None or not tool.idempotent):
        return _append_result(writer, pending, UNKNOWN, "unknown", on_tool)
    verdict = tool.approval(pending.call) if tool is not None else None
    params = {"approval": verdict.how} if verdict is not None else None
    if verdict is not None and not verdict.granted:
        return _append_result(writer, pending, f"not run: {verdict.how}", "error", on_tool,
                              params)
    if tool is not None and not tool.idempotent:
        # Durable before the tool runs: after a crash this marker is the only sign that
        # a side effect may have happened, and it is what stops a second run. Appended
        # (compare-and-append), so a second writer racing for the same call loses here.
        writer.append([writer.seal(role="tool", content="started", turn_id=pending.turn_id,
                                   status="partial", tool_call_id=pending.id, params=params)])
    text, status = invoke(tool, pending.call, available)
    return _append_result(writer, pending, text, status, on_tool, params)


def invoke(tool: Tool | None, call: dict[str, Any],
           available: dict[str, Tool]) -> tuple[str | list[Part], Status]:
    """Run ``tool`` for ``call``: (result text, status). Never raises for the tool's sake."""
    name, raw = call["function"]["name"], call["function"]["arguments"]
    if tool is None:
        names = ", ".join(sorted(available)) or "none were given"
        return f"error: there is no tool named {name!r} (available: {names})", "error"
    try:
        args = json.loads(raw or "{}")
    except ValueError as exc:
        return f"error: the arguments are not valid JSON ({exc}): {raw[:200]!r}", "error"
    if not isinstance(args, dict):
        return f"error: the arguments must be a JSON object, not {raw[:200]!r}", "error"
    try:
        kwargs = tool.parse_args(args)
    except ValueError as exc:
        return f"error: the arguments do not fit {name}'s parameters: {exc}", "error"
    token = _CALL_ID.set(str(call["id"]))
    try:
        result = tool.fn(**kwargs)
    except Exception as exc:  # the model sees the failure and may try again differently
        log.info("tool %s raised %s", name, type(exc).__name__)
        if getattr(exc, "outcome_unknown", False) and not tool.idempotent:
            # it reached the tool (an MCP call that timed out, or whose server died):
            # the side effect may have happened; "failed" would invite a second one
            return f"{UNKNOWN} ({exc})", "unknown"
        return f"error: {type(exc).__name__}: {exc}", "error"
    finally:
        _CALL_ID.reset(token)
    if isinstance(result, ToolOutput):  # content parts (an MCP result), maybe an error
        return result.content, "error" if result.error else "complete"
    return (result if isinstance(result, str) else _json_text(result)), "complete"


def _json_text(result: Any) -> str:
    """A tool's return value as JSON text, whatever it holds: it ran, so its result must
    reach the model (a dict with date keys, or a NaN, raised here, after the tool's side
    effect, and the turn could never be finished)."""
    try:
        return json.dumps(result, default=str, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(_plain(result), default=str, allow_nan=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def abandon(writer: TurnWriter, on_tool: OnTool | None = None) -> None:
    """Answer the pending calls of an interrupted turn that a new turn leaves behind.

    Without the tools at hand there is no telling whether an unmarked call was an
    idempotent tool already running, so every such call is answered ``unknown``.
    """
    for call in pending_calls(writer.conversation):
        _append_result(writer, call, ABANDONED, "unknown", on_tool)


def _answer_all(writer: TurnWriter, pending: list[PendingCall], text: str,
                on_tool: OnTool | None) -> None:
    for call in pending:
        _append_result(writer, call, text, "error", on_tool)


def _append_result(writer: TurnWriter, pending: PendingCall, text: str | list[Part],
                   status: Status, on_tool: OnTool | None,
                   params: dict[str, Any] | None = None) -> Message:
    # large images and files of a result go to the blob area, durably, before the message
    content = store_parts(writer.store, text) if isinstance(text, list) else text
    result = writer.seal(role="tool", content=content, turn_id=pending.turn_id, status=status,
                         tool_call_id=pending.id, params=params)
    writer.append([result])
    if on_tool is not None:
        on_tool(result)
    return result


def well_formed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request messages with every call answered and every result called for.

    Chat-completions wants each assistant message's calls answered by the ``tool``
    messages right after it. A call without its result is left out of its message
    (the message too, if nothing else is in it); a result without its call is
    left out. Neither happens in a transcript the loop wrote; this is the guard.
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") == "tool":
            log.warning("left out a tool result without its call (%s)", msg.get("tool_call_id"))
            i += 1
            continue
        if msg.get("role") != "assistant" or not msg.get("tool_calls"):
            out.append(msg)
            i += 1
            continue
        j = i + 1
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        out.extend(_answered(msg, messages[i + 1:j]))
        i = j
    return out


def _answered(asking: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = [c["id"] for c in asking["tool_calls"]]
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        if r.get("tool_call_id") in ids:
            first.setdefault(r["tool_call_id"], r)
        else:
            log.warning("left out a tool result without its call (%s)", r.get("tool_call_id"))
    calls = [c for c in asking["tool_calls"] if c["id"] in first]
    if len(calls) < len(ids):
        log.warning("left out %d tool call(s) without a result", len(ids) - len(calls))
    head = {k: v for k, v in asking.items() if k != "tool_calls"}
    if calls:
        head["tool_calls"] = calls
    elif not head.get("content"):
        return []  # nothing left in the message to send
    else:
        head["content"] = head["content"] or ""
    return [head, *(first[c["id"]] for c in calls)]
