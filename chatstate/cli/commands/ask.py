"""`chatstate ask`: one turn for scripts. stdout carries only the reply."""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from chatstate.cli import waiting
from chatstate.cli.common import Env, fail
from chatstate.cli.daily_options import Daily, daily_options
from chatstate.cli.functions import functions_option, load_functions, tool_printer
from chatstate.cli.mcp_options import ToolBox, mcp_options, open_mcp
from chatstate.cli.turns import (
    attach_option,
    attachments,
    conversation_options,
    open_chat,
    valid_text,
)
from chatstate.errors import ChatstateError, ConversationInUse, ModelError


@click.command()
@click.argument("prompt", required=False)
@conversation_options
@click.option("--no-stream", is_flag=True, help="Wait for the whole reply, then print it.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: conversation id, seqs, reply, usage.")
@click.option("--retry", is_flag=True, help="Complete the interrupted turn of --id/-c "
              "instead of sending a new prompt.")
@click.option("--keep-failed", is_flag=True, help="Keep a new conversation whose first "
              "message failed (by default it is removed: nothing but that message is in it).")
@daily_options
@attach_option
@functions_option
@mcp_options
@click.pass_obj
def ask(env: Env, prompt: str | None, conversation_id: str | None, cont: bool, new: bool,
        model: str | None, offline: bool, base_url: str | None, system: str | None,
        lease_wait: float, no_stream: bool, as_json: bool, retry: bool, keep_failed: bool,
        daily: Daily, attach: tuple[str, ...], functions: tuple[Path, ...],
        mcp_config: Path | None, mcp_commands: tuple[str, ...], yes: bool) -> None:
    """Send PROMPT (or stdin when PROMPT is '-' or absent) and print the reply.

    The user message is durable before the request is sent, and each piece of
    the reply is durable before it is printed. `--id ID` continues ID or
    creates it. With --functions or MCP servers (--mcp-config, --mcp), each tool
    call and its result is described on stderr once stored; an MCP tool that is
    neither read-only nor allow-listed runs only with --yes. Exit status: 0 ok,
    1 failure, 2 usage.
    """
    if retry and (attach or daily.files):
        raise click.UsageError("--retry completes the interrupted turn; it takes no --attach "
                               "or -f")
    if retry and daily.no_log:
        raise click.UsageError("--retry stores the turn it completes; it takes no --no-log")
    stdin_taken = "-" in daily.files
    if stdin_taken and prompt in (None, "-"):
        raise click.UsageError("-f - reads stdin as a file: give the prompt as an argument")
    files = daily.fragment_parts()  # read before anything is stored: a bad path stores nothing
    text = read_prompt(prompt, retry=retry, conversation_id=conversation_id, cont=cont,
                       piped=not stdin_taken)
    parts = files + attachments(attach)
    mcp = open_mcp(mcp_config, mcp_commands, "yes" if yes else "allow-list",
                   lambda line: click.echo(line, err=True))
    tools = ToolBox(load_functions(functions), mcp)
    system, model, params = daily.resolve(system, model)
    env.quiet = daily.quiet = env.quiet or daily.quiet
    with contextlib.closing(tools), open_chat(
            env, conversation_id=conversation_id, cont=cont, new=new, model=model,
            offline=offline, base_url=base_url, system=system, lease_wait=lease_wait,
            no_log=daily.no_log) as chat:
        daily.configure(chat, params)
        env.notice(f"conversation {chat.id}")
        note_before(chat, retry=retry)
        chat.on_tool = tool_printer(lambda line: click.echo(line, err=True))
        fresh = not chat.writer.created  # this command starts the conversation
        try:
            reply = one_turn(chat, text, stream=not (as_json or no_stream),
                             show=not as_json, daily=daily, attach=parts, tools=tools or None)
        except (KeyboardInterrupt, BrokenPipeError) as exc:
            # Ctrl-C, or the reader of stdout went away (`| head`): the partial is kept
            if chat.interrupted is not None:
                lead = "\n" if isinstance(exc, KeyboardInterrupt) else ""
                click.echo(f"{lead}{retry_hint(chat.id)}", err=True)
            raise
        except ChatstateError as exc:
            if chat.interrupted is None or isinstance(exc, ConversationInUse):
                raise  # nothing of this turn was stored: no turn to complete
            if env.debug:
                traceback.print_exc()
            if (fresh and not keep_failed and isinstance(exc, ModelError)
                    and exc.misconfigured and discard_failed_start(chat)):
                fail(f"{exc} Nothing was kept: conversation {chat.id} held only this "
                     "unanswered message, so it was removed (--keep-failed keeps it).")
            fail(f"{exc} {retry_hint(chat.id, exc)}")
            return
        note_after(chat, reply)
        if as_json:
            user = next((m for m in reversed(chat.messages)
                         if m.role == "user" and m.turn_id == reply.turn_id), None)
            stored = not daily.no_log  # unstored, a seq names nothing (the next turn's)
            click.echo(json.dumps({
                "conversation_id": chat.id, "turn_id": reply.turn_id,
                "user_seq": user.seq if user and stored else None,
                "reply_seq": reply.seq if stored else None,
                "reply": reply.content, "model": reply.model, "usage": reply.usage,
                "requested_model": reply.requested_model or reply.model,
                "finish_reason": reply.finish_reason or "stop",
                "sent_messages": len(chat.last_fit.messages) if chat.last_fit else None}))


def discard_failed_start(chat: Any) -> bool:
    """Remove the conversation a failed first attempt (a wrong key or URL) just started."""
    from chatstate.session.turn_state import unanswered_start

    chat.reload()
    if not unanswered_start(chat.conversation):
        return False
    chat.store.delete(chat.id)
    return True


def read_prompt(prompt: str | None, *, retry: bool, conversation_id: str | None,
                cont: bool, piped: bool = True) -> str:
    """The prompt text, checked before anything is opened; empty for --retry."""
    if retry:
        if prompt is not None:
            raise click.UsageError("--retry completes the interrupted turn; it takes no PROMPT")
        if not (conversation_id or cont):
            raise click.UsageError("--retry needs --id ID or -c to say which conversation")
        return ""
    if prompt is None or prompt == "-":
        if sys.stdin.isatty():
            click.echo("reading the prompt from the terminal; end it with Ctrl-D", err=True)
        # like $(...) in a shell: the newline that ends the piped text is not part of it
        prompt = sys.stdin.read().removesuffix("\n")
    elif piped:
        extra = piped_text()
        if extra:  # `cat notes.md | chatstate ask "Summarise:"`: the prompt, then the text
            prompt = f"{prompt}\n\n{extra}"
    text = valid_text(prompt, "the prompt")
    if not text.strip():
        raise click.UsageError("empty prompt: pass PROMPT or pipe text on stdin")
    return text


PIPED_LIMIT = 1024 * 1024  # more than any model's window takes in one message


def piped_text() -> str:
    """Text piped or redirected into stdin beside a PROMPT; "" for a terminal or /dev/null."""
    import os
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):  # no real stdin (closed, or replaced in-process)
        return ""
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return ""
    data = sys.stdin.buffer.read(PIPED_LIMIT + 1)
    if len(data) > PIPED_LIMIT:
        raise click.UsageError(
            f"the text piped on stdin is over {PIPED_LIMIT // 1024 // 1024} MiB; nothing was "
            "sent or stored: split it, or attach the file with -a PATH")
    return data.decode("utf-8", "surrogateescape").removesuffix("\n")


def one_turn(chat: Any, text: str, *, stream: bool, show: bool, daily: Daily,
             attach: list[dict[str, Any]] | None = None,
             tools: Any = None) -> Any:
    """Send ``text`` (or retry when it is empty); print as it becomes durable; return the reply."""
    from chatstate.cli.markdown import ReplyPrinter, print_stats

    spin = waiting.enabled()
    more = {"attach": attach} if attach else {}
    if not stream:
        with waiting.waiting(spin):
            reply = chat.send(text, tools=tools, **more) if text else chat.retry(tools=tools)
        note_fit(chat)
        if not show:
            return reply
        printer = ReplyPrinter(markdown=daily.markdown())
        printer.feed(reply.text)
    else:
        printer = ReplyPrinter(markdown=daily.markdown())
        try:
            deltas = (chat.stream(text, tools=tools, **more) if text
                      else chat.retry_stream(tools=tools))
            first = True
            for delta in waiting.until_first(deltas, spin):
                if first:  # the request was fitted before the first delta came back
                    note_fit(chat)
                    first = False
                printer.feed(delta)
        except BaseException:
            printer.abort()
            raise
        reply = chat.messages[-1]
    printer.close()
    if printer.markdown and not daily.quiet:
        print_stats(printer.stats(reply.usage))
    return reply


def note_fit(chat: Any) -> None:
    """Before the reply: that the request left older messages out (the store keeps them)."""
    fit = chat.last_fit
    if fit is not None and fit.trimmed:
        click.echo(f"note: {fit.describe()}; the older ones stay stored", err=True)


def retry_hint(cid: str, exc: BaseException | None = None) -> str:
    """What to do about the turn a failure left unanswered; ``exc`` says if a retry can help."""
    if isinstance(exc, ModelError) and not exc.retryable:
        return (f"Your message is stored in conversation {cid} without a reply. Sending it "
                "again as it is would fail the same way: change what the error names, then "
                f"`chatstate ask --id {cid} --retry` (--model picks another model), or just "
                "send a new message (the unanswered one is kept but not sent again).")
    return (f"Your message is stored in conversation {cid} but has no complete reply; "
            f"complete the turn with `chatstate ask --id {cid} --retry`.")


def note_before(chat: Any, *, retry: bool) -> None:
    """Say what a new message does to a turn left unanswered, or what --retry will do."""
    from chatstate.session.writer_lease import held_elsewhere

    turn = chat.interrupted
    # a live writer's reply in progress is no interrupted turn (and this one will be refused)
    if turn is not None and not retry and held_elsewhere(chat.store, chat.id) is None:
        click.echo(f"note: {turn.describe()}; it stays in the transcript but is not sent "
                   "to the model again (--retry would have completed it)", err=True)
    elif turn is None and retry and chat.cut_short is not None:
        click.echo("note: the last reply was cut short; asking the model to continue it",
                   err=True)


def note_after(chat: Any, reply: Any) -> None:
    from chatstate.session.sendable import CUT_REASONS

    why = CUT_REASONS.get(reply.finish_reason or "")
    if why:
        click.echo(f"note: {why} (finish_reason {reply.finish_reason}); `chatstate ask "
                   f"--id {chat.id} --retry` asks the model to continue", err=True)
