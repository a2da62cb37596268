"""`chatstate ask`: one turn for scripts. stdout carries only the reply."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from ..errors import ChatstateError
from .common import Env, fail
from .functions import functions_option, load_functions, tool_printer
from .render import neutralise
from .turns import conversation_options, open_chat, valid_text


@click.command()
@click.argument("prompt", required=False)
@conversation_options
@click.option("--no-stream", is_flag=True, help="Wait for the whole reply, then print it.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: conversation id, seqs, reply, usage.")
@click.option("--retry", is_flag=True, help="Complete the interrupted turn of --id/-c "
              "instead of sending a new prompt.")
@functions_option
@click.pass_obj
def ask(env: Env, prompt: str | None, conversation_id: str | None, cont: bool, new: bool,
        model: str | None, offline: bool, base_url: str | None, system: str | None,
        no_stream: bool, as_json: bool, retry: bool, functions: tuple[Path, ...]) -> None:
    """Send PROMPT (or stdin when PROMPT is '-' or absent) and print the reply.

    The user message is durable before the request is sent, and each piece of
    the reply is durable before it is printed. `--id ID` continues ID or
    creates it. With --functions, each tool call and its result is described
    on stderr once stored. Exit status: 0 ok, 1 failure, 2 usage.
    """
    text = read_prompt(prompt, retry=retry, conversation_id=conversation_id, cont=cont)
    tools = load_functions(functions)
    with open_chat(env, conversation_id=conversation_id, cont=cont, new=new, model=model,
                   offline=offline, base_url=base_url, system=system) as chat:
        click.echo(f"conversation {chat.id}", err=True)
        chat.on_tool = tool_printer(lambda line: click.echo(line, err=True))
        try:
            reply = one_turn(chat, text, stream=not (as_json or no_stream),
                             show=not as_json, tools=tools or None)
        except (KeyboardInterrupt, BrokenPipeError) as exc:
            # Ctrl-C, or the reader of stdout went away (`| head`): the partial is kept
            if chat.interrupted is not None:
                lead = "\n" if isinstance(exc, KeyboardInterrupt) else ""
                click.echo(f"{lead}{retry_hint(chat.id)}", err=True)
            raise
        except ChatstateError as exc:
            if chat.interrupted is None:
                raise
            if env.debug:
                traceback.print_exc()
            fail(f"{exc} {retry_hint(chat.id)}")
            return
        if as_json:
            user = next((m for m in reversed(chat.messages)
                         if m.role == "user" and m.turn_id == reply.turn_id), None)
            click.echo(json.dumps({
                "conversation_id": chat.id, "turn_id": reply.turn_id,
                "user_seq": user.seq if user else None, "reply_seq": reply.seq,
                "reply": reply.content, "model": reply.model, "usage": reply.usage}))


def read_prompt(prompt: str | None, *, retry: bool, conversation_id: str | None,
                cont: bool) -> str:
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
    text = valid_text(prompt, "the prompt")
    if not text.strip():
        raise click.UsageError("empty prompt: pass PROMPT or pipe text on stdin")
    return text


def one_turn(chat: Any, text: str, *, stream: bool, show: bool,
             tools: list[Any] | None = None) -> Any:
    """Send ``text`` (or retry when it is empty); print as it becomes durable; return the reply."""
    tty = sys.stdout.isatty()
    if not stream:
        reply = chat.send(text, tools=tools) if text else chat.retry(tools=tools)
        if show:
            click.echo(neutralise(reply.content) if tty else reply.content)
        return reply
    deltas = chat.stream(text, tools=tools) if text else chat.retry_stream(tools=tools)
    for delta in deltas:
        sys.stdout.write(neutralise(delta) if tty else delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return chat.messages[-1]


def retry_hint(cid: str) -> str:
    return (f"Your message is stored in conversation {cid} but has no complete reply; "
            f"complete the turn with `chatstate ask --id {cid} --retry`.")
