"""`chatstate chat`: the REPL. Line editing and history by prompt_toolkit.

Replies are rendered as they become durable (the session yields a delta only
after the store holds it). Ctrl-C cancels the reply in flight (the partial is
kept) without leaving the REPL; Ctrl-D exits.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import click

from .common import Env
from .functions import functions_option, load_functions, tool_printer
from .render import neutralise
from .turns import conversation_options, open_chat, valid_text

HELP = """commands:
  /help            this help
  /new             start a new conversation
  /history         show this conversation so far
  /retry           complete the interrupted turn
  /model [NAME]    show or switch the model
  /system TEXT     add a system instruction
  /title [TEXT]    show or set the conversation title
  /export FILE     write the conversation as JSON
  /exit            leave (or Ctrl-D)
Enter sends; Esc then Enter (or Alt-Enter) inserts a newline."""


@click.command()
@conversation_options
@click.option("--no-stream", is_flag=True, help="Print each reply whole.")
@functions_option
@click.pass_obj
def chat(env: Env, conversation_id: str | None, cont: bool, new: bool, model: str | None,
         offline: bool, base_url: str | None, system: str | None, no_stream: bool,
         functions: tuple[Path, ...]) -> None:
    """The chat REPL. With --functions, each tool call and result is shown once stored."""
    tools = load_functions(functions)
    with open_chat(env, conversation_id=conversation_id, cont=cont, new=new, model=model,
                   offline=offline, base_url=base_url, system=system) as session:
        Repl(session, stream=not no_stream, tools=tools).run()


class Repl:
    def __init__(self, session: Any, *, stream: bool, tools: list[Any] | None = None) -> None:
        self.chat = session
        self.stream = stream
        self.tools = tools or None
        self.midline = False  # a streamed reply is on screen without its newline yet
        session.on_tool = tool_printer(self.tool_line)
        self.read = make_reader()
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

    def handle(self, line: str) -> str | None:
        """One input line; a failed command says why and the REPL carries on."""
        from ..errors import ChatstateError

        if not line.strip():
            return None
        try:
            text = valid_text(line, "that input")
            if text.startswith("/"):
                return self.command(text.strip())
            self.render(partial(self.chat.stream, text, tools=self.tools),
                        partial(self.chat.send, text, tools=self.tools))
        except KeyboardInterrupt:
            self.say("[interrupted]")
        except (ChatstateError, click.UsageError, OSError) as exc:
            self.say(f"error: {exc.format_message() if isinstance(exc, click.UsageError) else exc}")
        return None

    def greet(self) -> None:
        c = self.chat
        self.say(f"conversation {c.id} · model {c.model or '(default)'} · /help for commands")
        for m in c.messages[-6:]:
            self.show(m)
        turn = c.interrupted
        if turn is not None:
            self.say(f"! the last turn was interrupted: {turn.describe()}. Type /retry to "
                     "complete it.")
            if turn.partial is not None:
                tail = turn.partial.content
                tail = tail if len(tail) <= 200 else "…" + tail[-200:]
                self.say("  partial reply so far: " + neutralise(tail))

    def show(self, m: Any) -> None:
        if m.role != "tool" and (m.text or not m.tool_calls):
            tag = " (partial)" if m.status == "partial" else ""
            click.echo(f"{m.role}{tag}> {neutralise(m.text)}")
        if m.tool_calls or m.role == "tool":
            tool_printer(click.echo)(m)

    def tool_line(self, line: str) -> None:
        """A tool call or result, printed when it is stored, on a line of its own."""
        if self.midline:
            sys.stdout.write("\n")
            self.midline = False
        click.echo(line)

    def render(self, streamer: Callable[[], Iterator[str]], sender: Callable[[], Any]) -> None:
        from ..errors import ChatstateError

        try:
            if self.stream:
                for delta in streamer():
                    if not self.midline:
                        sys.stdout.write("assistant> ")
                        self.midline = True
                    sys.stdout.write(neutralise(delta))
                    sys.stdout.flush()
                sys.stdout.write("\n" if self.midline else "")
                self.midline = False
            else:
                self.show(sender())
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            self.midline = False
            self.say("[interrupted: the partial reply is kept; /retry completes the turn]")
        except ChatstateError as exc:
            sys.stdout.write("\n")
            self.midline = False
            self.say(f"error: {exc}")
            if self.chat.interrupted is not None:
                self.say("[your message is stored; /retry completes the turn]")

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
        from ..transcript import new_id

        self.chat.id = new_id()
        self.chat.reload()
        self.say(f"new conversation {self.chat.id}")

    def do_history(self, _: str) -> None:
        for m in self.chat.messages:
            self.show(m)
        if self.chat.conversation.partial is not None:
            self.show(self.chat.conversation.partial)

    def do_retry(self, _: str) -> None:
        if self.chat.interrupted is None:
            self.say("nothing to retry: the last turn is complete")
        else:
            self.render(partial(self.chat.retry_stream, tools=self.tools),
                        partial(self.chat.retry, tools=self.tools))

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

        from ..stores._files import atomic_write
        from ..transfer import export_json

        path = Path(target).expanduser().absolute()
        atomic_write(path, export_json(self.chat.store.load(self.chat.id)).encode())
        self.say(f"exported to {path}")


# name -> (Repl method, what the argument is when one is required)
COMMANDS: dict[str, tuple[str, str | None]] = {
    "/help": ("do_help", None), "/new": ("do_new", None), "/history": ("do_history", None),
    "/retry": ("do_retry", None), "/model": ("do_model", None),
    "/system": ("do_system", "TEXT"), "/title": ("do_title", None),
    "/export": ("do_export", "FILE"),
}


def make_reader() -> Callable[[], str]:
    """prompt_toolkit on a terminal (line editing, persistent history); plain stdin otherwise."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        def plain() -> str:
            line = sys.stdin.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n")
        return plain
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    from ..doctor import history_path

    path = history_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    session: PromptSession[str] = PromptSession(history=FileHistory(str(path)),
                                                key_bindings=keys, multiline=False)
    return lambda: session.prompt("you> ")
