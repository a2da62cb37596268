"""`chatstate chat`: the REPL. Line editing and history by prompt_toolkit.

Replies are rendered as they become durable (the session yields a delta only
after the store holds it). Ctrl-C cancels the reply in flight (the partial is
kept) without leaving the REPL; Ctrl-D exits.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import click

from chatstate.cli import waiting
from chatstate.cli.common import Env
from chatstate.cli.daily_options import Daily, daily_options
from chatstate.cli.functions import functions_option, load_functions, tool_printer
from chatstate.cli.mcp_options import ToolBox, mcp_options, open_mcp
from chatstate.cli.render import clip, neutralise
from chatstate.cli.repl.fork import ForkCommands
from chatstate.cli.repl.line_input import keys_held, make_reader
from chatstate.cli.repl.tools import ToolCommands
from chatstate.cli.turns import (
    attach_option,
    attachments,
    conversation_options,
    open_chat,
    valid_text,
)
from chatstate.ops.replay_text import content_text
from chatstate.session.writer_lease import held_elsewhere

HELP = """commands:
  /help            this help
  /new             start a new conversation
  /history         show this conversation so far
  /retry           complete the interrupted turn
  /continue        ask the model to go on with a reply cut at the token limit
  /model [NAME]    show or switch the model
  /system TEXT     add a system instruction
  /title [TEXT]    show or set the conversation title
  /export FILE     write the conversation as JSON
  /compact         summarise the older turns (they stay stored; requests send the summary)
  /fork            continue in a copy of this conversation (this one stays as it is)
  /edit TEXT       ask again with TEXT instead of your last message (same attachments), in a fork
  /attach PATH     attach an image or file (or an image URL) to your next message
  /tools [off|on]  list the tools and MCP servers, or stop / start offering them
  /editor          write your next message in $EDITOR (as Ctrl-X Ctrl-E)
  /copy [code]     copy the last reply (or its last code block) to the clipboard
  /exit            leave (or Ctrl-D)
Enter sends; Esc then Enter (or Alt-Enter) inserts a newline; Ctrl-X Ctrl-E edits the
message in $EDITOR."""


@click.command()
@conversation_options
@click.option("--no-stream", is_flag=True, help="Print each reply whole.")
@daily_options
@attach_option
@functions_option
@mcp_options
@click.pass_obj
def chat(env: Env, conversation_id: str | None, cont: bool, new: bool, model: str | None,
         offline: bool, base_url: str | None, system: str | None, lease_wait: float,
         no_stream: bool, daily: Daily, attach: tuple[str, ...], functions: tuple[Path, ...],
         mcp_config: Path | None, mcp_commands: tuple[str, ...], yes: bool) -> None:
    """The chat REPL. --attach goes with the first message you send; with --functions
    or MCP servers (--mcp-config, --mcp), each tool call and result is shown once
    stored, and an MCP tool that changes things asks first (y / n / always)."""
    if "-" in daily.files:
        raise click.UsageError("-f - reads stdin, which the REPL reads your messages from: "
                               "name the file instead")
    parts = daily.fragment_parts() + attachments(attach)
    approve: Any = "yes" if yes else None
    mcp = open_mcp(mcp_config, mcp_commands, approve or "allow-list",
                   lambda line: click.echo(line, err=True))
    tools = ToolBox(load_functions(functions), mcp)
    system, model, params = daily.resolve(system, model)
    env.quiet = daily.quiet = env.quiet or daily.quiet
    with contextlib.closing(tools), open_chat(
            env, conversation_id=conversation_id, cont=cont, new=new, model=model,
            offline=offline, base_url=base_url, system=system,
            lease_wait=lease_wait, no_log=daily.no_log) as session:
        daily.configure(session, params)
        repl = Repl(session, stream=not no_stream, daily=daily, tools=tools)
        if mcp is not None and approve is None:
            mcp.approve = repl.approve_prompt
        repl.pending = parts
        repl.run()
    if repl.failed and not sys.stdin.isatty():
        raise click.exceptions.Exit(1)  # scripted input: a line that failed fails the command


class Repl(ForkCommands, ToolCommands):
    def __init__(self, session: Any, *, stream: bool, daily: Daily | None = None,
                 tools: ToolBox | None = None) -> None:
        self.chat = session
        self.stream = stream
        self.daily = daily or Daily()
        self.told_fit: set[str] = set()  # conversations whose trimming was announced
        self.toolbox = tools
        self.tools_on = True
        self._always_for = session.id  # "always" answers hold in this conversation only
        self.printer: Any = None  # the reply being printed, if any
        session.on_tool = tool_printer(self.tool_line)
        self.read = make_reader()
        self.pending: list[dict[str, Any]] = []  # /attach: parts for the next message
        self.failed = False  # a line was refused or failed (the exit status, for piped input)
        # A shell starts background jobs with SIGINT ignored, and that is inherited; the
        # REPL's Ctrl-C (cancel the reply in flight, keep the partial) needs it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def say(self, text: str) -> None:
        click.echo(text, err=True)

    def run(self) -> None:
        self.greet()
        while True:
            try:
                line = self.read()
            except KeyboardInterrupt:
                continue
            except EOFError:
                self.say("bye")
                return
            if self.handle(line) == "exit":
                return

    def handle(self, line: str, *, as_message: bool = False) -> str | None:
        """One input line (``as_message``: sent even if it starts with /); a failed command
        says why and the REPL carries on."""
        from chatstate.errors import ChatstateError

        if not line.strip():
            return None
        try:
            text = valid_text(line, "that input")
            if text.startswith("/") and not as_message:
                return self.command(text.strip())
            turn = self.chat.interrupted
            if turn is not None:  # another writer may have finished it since it was loaded
                self.chat.reload()
                turn = self.chat.interrupted
            if turn is not None and held_elsewhere(self.chat.store, self.chat.id) is None:
                self.say(f"[{turn.describe()}: it is kept but not sent again]")
            more, self.pending = {"attach": self.pending} if self.pending else {}, []
            self.new_conversation_check()
            self.render(partial(self.chat.stream, text, tools=self.tools, **more),
                        partial(self.chat.send, text, tools=self.tools, **more))
        except KeyboardInterrupt:
            self.say("[interrupted]")
        except (ChatstateError, click.UsageError, OSError) as exc:
            self.failed = True
            self.say(f"error: {exc.format_message() if isinstance(exc, click.UsageError) else exc}")
        return None

    def new_conversation_check(self) -> None:
        if self.chat.id != self._always_for and self.toolbox is not None and \
                self.toolbox.mcp is not None:
            self.toolbox.mcp.forget_always()
        self._always_for = self.chat.id

    def greet(self) -> None:
        c = self.chat
        kept = " · not stored (--no-log)" if c.unlogged else ""
        self.say(f"conversation {c.id} · model {c.model or '(default)'}{kept} · /help for "
                 "commands")
        for m in c.messages[-6:]:
            self.show(m)
        turn = c.interrupted
        live = held_elsewhere(c.store, c.id) if turn is not None else None
        if live is not None:
            self.say(f"! another writer is replying in this conversation now (host "
                     f"{live.host}, pid {live.pid}): what you send is refused until it is done.")
        elif turn is not None:
            self.say(f"! the last turn was interrupted: {turn.describe()}. Type /retry to "
                     "complete it. (A new message leaves it unanswered: kept, not sent.)")
        if turn is not None and turn.partial is not None:
            tail = turn.partial.content
            tail = tail if len(tail) <= 200 else "…" + tail[-200:]
            self.say("  partial reply so far: " + neutralise(tail))
        elif turn is None and c.cut_short is not None:
            self.note_cut()

    def show(self, m: Any, *, whole: bool = False) -> None:
        """One message; long ones clipped (``chatstate replay`` prints them whole)."""
        if m.role != "tool" and (m.text or not m.tool_calls):
            tag = " (partial)" if m.status == "partial" else ""
            tag += " (summary)" if (m.params or {}).get("summary") and m.role == "system" \
                else ""
            text = content_text(m.content)
            text = text if whole else clip(text, f"chatstate replay {self.chat.id}")
            click.echo(f"{m.role}{tag}> {neutralise(text)}")
        if m.tool_calls or m.role == "tool":
            tool_printer(click.echo)(m)

    def tool_line(self, line: str) -> None:
        """A tool call or result, printed when it is stored, on a line of its own; the
        reply's text goes on under it."""
        from chatstate.cli.markdown import ReplyPrinter

        if self.printer is not None and self.printer.text:
            self.printer.close()
            self.printer = ReplyPrinter(markdown=self.printer.markdown, prefix="assistant> ")
        click.echo(line)

    def render(self, streamer: Callable[[], Iterator[str]], sender: Callable[[], Any]) -> None:
        from chatstate.cli.markdown import ReplyPrinter, print_stats
        from chatstate.errors import ChatstateError

        spin = waiting.enabled()
        self.printer = ReplyPrinter(markdown=self.daily.markdown(), prefix="assistant> ")
        try:
            with keys_held():
                if self.stream:
                    for delta in waiting.until_first(streamer(), spin):
                        self.printer.feed(delta)
                else:
                    with waiting.waiting(spin):
                        reply = sender()
                    self.printer.feed(reply.text)
        except KeyboardInterrupt:
            self._abort(self.printer)
            self.say("[interrupted: the partial reply is kept; /retry completes the turn]")
        except ChatstateError as exc:
            from chatstate.errors import ConversationInUse, ModelError

            self._abort(self.printer)
            self.say(f"error: {exc}")
            if isinstance(exc, ConversationInUse):
                self.say("[nothing was stored or sent; send it again once the other writer "
                         "is done]")
                return
            if self.chat.interrupted is None:
                return
            if isinstance(exc, ModelError) and not exc.retryable:
                self.say("[your message is stored without a reply; as it is, /retry would "
                         "fail the same way: change what the error names (/model), or type "
                         "a new message (the unanswered one is kept but not sent again)]")
            else:
                self.say("[your message is stored; /retry completes the turn]")
        else:
            self.printer.close()
            if self.printer.markdown and not self.daily.quiet:
                print_stats(self.printer.stats(self.chat.messages[-1].usage))
            self.note_cut()
        finally:
            self.printer = None
        self.tell_fit()

    def _abort(self, printer: Any) -> None:
        printer.abort()
        if not printer.markdown:
            sys.stdout.write("\n")
        sys.stdout.flush()

    def tell_fit(self) -> None:
        """Once per conversation: that older messages were left out of the request."""
        fit = self.chat.last_fit
        if fit is not None and fit.trimmed and self.chat.id not in self.told_fit:
            self.told_fit.add(self.chat.id)
            self.say(fit.describe())

    def note_cut(self) -> None:
        from chatstate.session.sendable import CUT_REASONS

        cut = self.chat.cut_short
        if cut is not None:
            self.say(f"[{CUT_REASONS[cut.finish_reason]}; /continue asks the model to go on]")

    def command(self, line: str) -> str | None:
        name, _, arg = line.partition(" ")
        if name in ("/exit", "/quit"):
            return "exit"
        action = COMMANDS.get(name)
        if action is None:
            self.say(f"unknown command {name!r}; /help lists them")
            return None
        method, needs = action
        if needs and not arg.strip():
            self.say(f"{name} needs {needs}: {name} {needs}")
            return None
        getattr(self, method)(arg.strip())
        return None

    def do_help(self, _: str) -> None:
        self.say(HELP)

    def do_new(self, _: str) -> None:
        from chatstate.core.transcript import new_id

        self.chat.id = new_id()
        self.chat.reload()
        self.say(f"new conversation {self.chat.id}")

    def do_history(self, _: str) -> None:
        for m in self.chat.messages:
            self.show(m)
        if self.chat.conversation.partial is not None:
            self.show(self.chat.conversation.partial)

    def do_retry(self, _: str) -> None:
        if self.chat.interrupted is None and self.chat.cut_short is None:
            self.say("nothing to retry: the last turn is complete")
        else:
            self.render(partial(self.chat.retry_stream, tools=self.tools),
                        partial(self.chat.retry, tools=self.tools))

    def do_continue(self, _: str) -> None:
        if self.chat.interrupted is not None:
            self.say("the last turn was interrupted: /retry completes it")
        elif self.chat.cut_short is None:
            self.say("nothing to continue: the last reply was not cut short")
        else:
            self.render(self.chat.retry_stream, self.chat.retry)

    def do_attach(self, arg: str) -> None:
        from chatstate.ops.replay_text import part_text

        (part,) = attachments([arg])
        self.pending.append(part)
        self.say(f"attached {part_text(part)}; it goes with your next message")

    def do_editor(self, _: str) -> None:
        """Open $EDITOR for the next message (the same editor Ctrl-X Ctrl-E opens); what is
        saved is sent as it is, and an empty file sends nothing."""
        from chatstate.cli.repl.line_input import read_in_editor

        text = read_in_editor(self.read)
        if text is None:
            self.say("/editor needs a terminal (it opens $EDITOR there); pipe the message in "
                     "instead")
        elif not text.strip():
            self.say("[the editor left no message: nothing sent]")
        else:
            self.handle(text.removesuffix("\n"), as_message=True)

    def do_copy(self, arg: str) -> None:
        from chatstate.cli.clipboard import copy, last_code_block

        reply = next((m for m in reversed(self.chat.messages)
                      if m.role == "assistant" and m.text), None)
        if reply is None:
            self.say("nothing to copy: there is no reply yet")
            return
        if arg not in ("", "code"):
            self.say("/copy copies the last reply; /copy code its last code block")
            return
        text = reply.text if arg == "" else last_code_block(reply.text)
        if text is None:
            self.say("the last reply has no code block; /copy copies all of it")
            return
        used = copy(text)
        what = "the last code block" if arg else "the last reply"
        if used is None:
            self.say("no clipboard here: no wl-copy, xclip or pbcopy, and no terminal for "
                     "OSC 52; `chatstate replay` prints the reply to copy by hand")
        else:
            self.say(f"copied {what} ({len(text)} characters) with {used}")

    def do_model(self, arg: str) -> None:
        if arg:
            self.chat.model = arg
        self.say(f"model {self.chat.model or '(default)'}")

    def do_system(self, arg: str) -> None:
        self.chat.add_system(arg)
        self.say("system instruction stored")

    def do_title(self, arg: str) -> None:
        if arg:
            self.chat.set_title(arg)
        self.say(f"title: {neutralise(self.chat.conversation.title) or '(none)'}")

    def do_export(self, target: str) -> None:
        from pathlib import Path

        from chatstate.ops.transfer import export_json, write_export

        path = Path(target).expanduser().absolute()
        write_export(path, export_json(self.chat.store.load(self.chat.id), self.chat.store))
        self.say(f"exported to {path}")


# name -> (Repl method, what the argument is when one is required)
COMMANDS: dict[str, tuple[str, str | None]] = {
    "/help": ("do_help", None), "/new": ("do_new", None), "/history": ("do_history", None),
    "/retry": ("do_retry", None), "/continue": ("do_continue", None), "/model": ("do_model", None),
    "/system": ("do_system", "TEXT"), "/title": ("do_title", None),
    "/export": ("do_export", "FILE"), "/compact": ("do_compact", None),
    "/fork": ("do_fork", None), "/edit": ("do_edit", "TEXT"), "/attach": ("do_attach", "PATH"),
    "/editor": ("do_editor", None), "/copy": ("do_copy", None),
    "/tools": ("do_tools", None),
}
