"""`chatstate ask`: one turn for scripts. stdout carries only the reply."""

from __future__ import annotations

import json
import sys

import click

from .common import Env
from .render import neutralise
from .turns import conversation_options, open_chat


@click.command()
@click.argument("prompt", required=False)
@conversation_options
@click.option("--no-stream", is_flag=True, help="Wait for the whole reply, then print it.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: conversation id, seqs, reply, usage.")
@click.option("--retry", is_flag=True, help="Complete the interrupted turn of --id/-c "
              "instead of sending a new prompt.")
@click.pass_obj
def ask(env: Env, prompt: str | None, conversation_id: str | None, cont: bool, new: bool,
        model: str | None, offline: bool, base_url: str | None, system: str | None,
        no_stream: bool, as_json: bool, retry: bool) -> None:
    """Send PROMPT (or stdin when PROMPT is '-' or absent) and print the reply.

    The user message is durable before the request is sent, and each piece of
    the reply is durable before it is printed. `--id ID` continues ID or
    creates it.
    """
    if not retry and (prompt is None or prompt == "-"):
        prompt = sys.stdin.read()
    if not retry and not (prompt or "").strip():
        raise click.UsageError("empty prompt: pass PROMPT or pipe text on stdin")
    tty = sys.stdout.isatty()
    with open_chat(env, conversation_id=conversation_id, cont=cont, new=new, model=model,
                   offline=offline, base_url=base_url, system=system) as chat:
        click.echo(f"conversation {chat.id}", err=True)
        try:
            if as_json or no_stream:
                reply = chat.retry() if retry else chat.send(prompt or "")
                if not as_json:
                    click.echo(neutralise(reply.content) if tty else reply.content)
            else:
                deltas = chat.retry_stream() if retry else chat.stream(prompt or "")
                for delta in deltas:
                    sys.stdout.write(neutralise(delta) if tty else delta)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                reply = chat.messages[-1]
        except Exception as exc:
            if chat.interrupted is not None:
                click.echo(f"the turn is stored but has no complete reply; complete it with "
                           f"`chatstate ask --id {chat.id} --retry`", err=True)
            raise exc
        if as_json:
            user = next((m for m in reversed(chat.messages)
                         if m.role == "user" and m.turn_id == reply.turn_id), None)
            click.echo(json.dumps({
                "conversation_id": chat.id, "turn_id": reply.turn_id,
                "user_seq": user.seq if user else None, "reply_seq": reply.seq,
                "reply": reply.content, "model": reply.model, "usage": reply.usage}))
