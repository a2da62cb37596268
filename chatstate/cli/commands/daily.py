"""templates, fork, compact and usage: thin shells over chatstate.ops (templates, fork, usage)
and chatstate.session.compact."""

from __future__ import annotations

import json
from pathlib import Path

import click

from chatstate.cli.common import Env, fail
from chatstate.cli.render import neutralise
from chatstate.cli.turns import api_option


@click.group()
def templates() -> None:
    """Saved system prompts (with a model and params): chat --template NAME, ask -t NAME."""


@templates.command("save")
@click.argument("name")
@click.option("--system", default="", metavar="TEXT",
              help="The system prompt (none if left out); {key} placeholders are filled "
                   "by -p key value.")
@click.option("--model", "-m", metavar="M", help="Model to use with it.")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="A request parameter, e.g. temperature=0.2 (repeatable).")
def templates_save(name: str, system: str, model: str | None, params: tuple[str, ...]) -> None:
    """Save (or replace) template NAME."""
    from chatstate.errors import TemplateError
    from chatstate.ops import templates as lib

    try:
        parsed = dict(lib.parse_param(p) for p in params)
    except TemplateError as exc:
        raise click.UsageError(str(exc)) from exc
    tpl = lib.Template(name, system, model, parsed)
    path = lib.save(tpl)
    click.echo(f"saved template {name} to {path}", err=True)


@templates.command("list")
def templates_list() -> None:
    """Names of the saved templates."""
    from chatstate.ops import templates as lib

    names = lib.list_names()
    for name in names:
        click.echo(name)
    if not names:
        click.echo(f"(no templates in {lib.templates_dir()})", err=True)


@templates.command("show")
@click.argument("name")
def templates_show(name: str) -> None:
    """Print template NAME as stored (TOML)."""
    from chatstate.ops import templates as lib

    click.echo(neutralise(lib.load(name).to_toml()), nl=False)


@templates.command("rm")
@click.argument("name")
def templates_rm(name: str) -> None:
    """Delete template NAME."""
    from chatstate.ops import templates as lib

    lib.remove(name)
    click.echo(f"removed template {name}", err=True)


@click.command()
@click.argument("conversation_id", metavar="ID")
@click.option("--at", "at", type=int, metavar="SEQ", help="Last seq to copy (default: all).")
@click.option("--new-id", metavar="NEW", help="Id of the fork (default: a fresh one).")
@click.pass_obj
def fork(env: Env, conversation_id: str, at: int | None, new_id: str | None) -> None:
    """Copy messages 0..SEQ of ID into a new conversation; ID is not changed."""
    from chatstate.ops.fork import fork as fork_conversation

    new = fork_conversation(env.store(), conversation_id, at=at, new_conversation_id=new_id)
    click.echo(new.id)
    click.echo(f"forked {conversation_id} at seq {new.metadata['forked_from']['seq']} into "
               f"{new.id} ({len(new.messages)} messages); continue it with "
               f"`chatstate chat --id {new.id}`", err=True)


@click.command()
@click.argument("conversation_id", metavar="ID")
@click.option("--keep", "keep_turns", type=click.IntRange(min=0), default=2, show_default=True,
              help="Newest turns to keep word for word.")
@click.option("--model", "-m", metavar="M", help="Model that writes the summary ('fake' "
              "for the offline fake).")
@click.option("--base-url", metavar="URL", help="OpenAI-compatible endpoint.")
@api_option
@click.pass_obj
def compact(env: Env, conversation_id: str, keep_turns: int, model: str | None,
            base_url: str | None) -> None:
    """Summarise the older turns of ID; later requests send the summary instead.

    The summary is stored as a system message marked summary; the turns it
    covers stay in the store.
    """
    from chatstate.cli.turns import open_chat
    from chatstate.session.compact import compact as compact_chat

    with open_chat(env, conversation_id=conversation_id, cont=False, new=False, model=model,
                   offline=False, base_url=base_url, system=None) as chat:
        if not chat.messages:
            fail(f"no conversation {conversation_id!r} in {env.store().url}")
        summary = compact_chat(chat, keep_turns=keep_turns)
    if summary is None:
        click.echo(f"nothing to compact: {conversation_id} has at most {keep_turns} turns "
                   "after its last summary", err=True)
        return
    covers = summary.params["summary"]["covers_to_seq"] if summary.params else "?"
    click.echo(f"stored summary at seq {summary.seq} (covers seqs up to {covers})", err=True)
    click.echo(neutralise(summary.text))


@click.command()
@click.option("--since", metavar="SPAN", help="Only replies since: 7d, 12h, 2w or a date.")
@click.option("--by", type=click.Choice(["model", "conversation", "day"]), default="model",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The same data as JSON.")
@click.option("--prices", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML price table: [models.\"NAME\"] input/output dollars per million "
                   "tokens (none bundled).")
@click.pass_obj
def usage(env: Env, since: str | None, by: str, as_json: bool, prices: Path | None) -> None:
    """Token usage the provider reported, totalled from the store."""
    from chatstate.errors import InvalidOption
    from chatstate.ops import usage as lib

    try:
        start = lib.parse_since(since) if since else None
    except InvalidOption as exc:  # a usage error (2), as prune's --older-than is
        raise click.UsageError(str(exc)) from exc
    report = lib.collect(env.reader(), by=by, since=start,
                         prices=lib.load_prices(prices) if prices else None)
    for note in report.skipped:
        click.echo(f"skipped a damaged transcript: {note}", err=True)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    width = max([len(by), *(len(r.key) for r in report.rows)])
    click.echo(f"{by:<{width}}  {'replies':>7}  {'prompt':>10}  {'completion':>10}"
               + ("  cost (USD)" if prices else ""))
    for r in report.rows:
        cost = "" if not prices else ("  ?" if r.cost is None else f"  {r.cost:.6f}")
        click.echo(f"{neutralise(r.key):<{width}}  {r.replies:>7}  {r.prompt_tokens:>10}  "
                   f"{r.completion_tokens:>10}{cost}")
    if not report.rows:
        click.echo("(no replies with usage)", err=True)
    if report.unpriced:
        click.echo(f"no price for {', '.join(report.unpriced)} in {prices}", err=True)
