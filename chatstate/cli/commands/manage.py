"""list, replay, export, import, rm, prune, search, repair: the transcript housekeeping."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from chatstate.cli.common import Env, fail
from chatstate.cli.render import neutralise

if TYPE_CHECKING:
    from chatstate.stores.base import Store


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most N conversations.")
@click.option("--check", is_flag=True, help="Load and verify each one, and flag the damaged "
              "(exit 1), the interrupted and the cut short.")
@click.pass_obj
def list_cmd(env: Env, as_json: bool, limit: int | None, check: bool) -> None:
    """List conversations, most recently updated first.

    Listing reads only each conversation's header; --check reads every transcript too
    (on a big store that takes a while), so it can say which are damaged or interrupted.
    """
    store = env.reader()
    rows = store.list_conversations(limit=limit)
    flagged = {r.id: conversation_flags(store, r.id) for r in rows} if check else {}
    if as_json:
        click.echo(json.dumps([{**r.model_dump(), **({"flags": flagged[r.id]} if check else {})}
                               for r in rows], indent=2))
    else:
        for r in rows:
            flags = "".join(f"  [{neutralise(f)}]" for f in flagged.get(r.id, ()))
            click.echo(f"{r.id}  {r.updated_at[:19]}  {r.message_count:>5} msgs  "
                       f"{neutralise(r.title)}{flags}")
        if not rows:
            click.echo("(no conversations)", err=True)
    damaged = [cid for cid, flags in flagged.items() if any(f.startswith("damaged") for f in flags)]
    if damaged:
        fail(f"{len(damaged)} damaged conversation(s): {', '.join(damaged)}; `chatstate replay "
             "ID --verify` names the break, `chatstate repair ID` moves one aside")


def conversation_flags(store: Store, conversation_id: str) -> list[str]:
    """What `list --check` says of one conversation: damaged, interrupted, cut short."""
    from chatstate.errors import CorruptTranscriptError
    from chatstate.session.turn_state import cut_short_reply, interrupted_turn
    try:
        conv = store.load(conversation_id)
    except CorruptTranscriptError as exc:
        where = f" at seq {exc.position}" if exc.position is not None else ""
        return [f"damaged{where}"]
    bad = conv.verify()
    if bad is not None:
        return [f"damaged at seq {bad}"]
    flags = []
    if interrupted_turn(conv) is not None:
        flags.append("interrupted")
    if cut_short_reply(conv) is not None:
        flags.append("cut short")
    return flags


@click.command()
@click.argument("conversation_id", metavar="ID")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json", "jsonl"]),
              default="text", show_default=True)
@click.option("--verify", is_flag=True, help="Check the hash chain; exit 1 naming the first "
              "bad seq.")
@click.option("--raw", is_flag=True, help="Plain text even on a terminal (no Markdown).")
@click.option("--requests", "requests", is_flag=True,
              help="The requests its turns made instead (model, options, tools, schema, "
              "HTTP status, duration, upstream request id); --format json: one JSON array.")
@click.pass_obj
def replay(env: Env, conversation_id: str, fmt: str, verify: bool, raw: bool,
           requests: bool) -> None:
    """Print a stored transcript (a partial reply shows as status partial).

    On a terminal the text format is rendered as Markdown, unless --raw, NO_COLOR
    or TERM=dumb.
    """
    from chatstate.errors import CorruptTranscriptError
    from chatstate.ops.transfer import render

    try:
        store = env.store(writes=False, keyless=verify)
        if verify:  # with the key: the chain over the stored bytes checked too
            from chatstate.stores.sealed import verified_load

            conv = verified_load(store, conversation_id)
        else:
            conv = store.load(conversation_id)
    except CorruptTranscriptError as exc:
        where = f" at seq {exc.position}" if exc.position is not None else ""
        fail(f"verification failed{where}: {exc}")
    from chatstate.stores.sealed import describe_sealed, is_sealed

    if verify and is_sealed(conv):  # an encrypted store, no key: the chain over ciphertext
        click.echo(describe_sealed(conv), err=True)
        return
    from chatstate.cli.daily_options import use_markdown

    if requests:
        from chatstate.ops.request_log import request_lines, requests_of

        rows = requests_of(conv)
        if fmt in ("json", "jsonl"):
            click.echo(json.dumps(rows, indent=2) if fmt == "json" else
                       "\n".join(json.dumps(r) for r in rows))
        else:
            for line in request_lines(rows):
                click.echo(neutralise(line))
            if not rows:
                click.echo("(no requests recorded)", err=True)
    elif fmt == "text" and use_markdown(raw):
        from chatstate.cli.markdown import print_markdown

        print_markdown(render(conv, "markdown"))
    else:
        text = render(conv, fmt)
        click.echo(neutralise(text) if fmt in ("text", "markdown") else text)
    if verify:
        from chatstate.stores.blobs import verify_blobs

        bad = conv.verify()
        if bad is not None:
            fail(f"hash chain broken at seq {bad}")
        try:
            blobs = verify_blobs(env.store(), conv)
        except CorruptTranscriptError as exc:
            fail(f"verification failed: {exc}")
        tip = conv.last.hash[:16] if conv.last else "-"
        checked = f", {blobs} blob(s) match their sha256" if blobs else ""
        if getattr(env.store(), "codec", None) is not None:
            checked += ", every record's authentication tag checked with the key"
        click.echo(f"verified: {len(conv.messages)} messages, chain intact (head {tip}…)"
                   f"{checked}", err=True)
    if conv.partial is not None or (conv.last and conv.last.role == "user"):
        click.echo("note: the last turn was interrupted; `chatstate ask --id "
                   f"{conv.id} --retry` completes it", err=True)


@click.command()
@click.argument("conversation_id", metavar="ID")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="File to write ('-' for stdout).")
@click.option("--format", "fmt", type=click.Choice(["chatstate", "openai", "jsonl"]),
              default="chatstate", show_default=True,
              help="chatstate: hashes, partial and blobs; openai: a chat-completions messages "
              "list (jsonl: one per line), images and files inlined as data URLs.")
@click.pass_obj
def export(env: Env, conversation_id: str, output: Path, fmt: str) -> None:
    """Write a conversation (with hashes, any partial reply and its blobs) as JSON."""
    from chatstate.ops.transfer import export_json, export_openai, write_export

    store = env.reader()
    conv = store.load(conversation_id)
    data = export_json(conv, store) if fmt == "chatstate" else \
        export_openai(conv, store, jsonl=fmt == "jsonl")
    if str(output) == "-":
        sys.stdout.write(data)
        return
    write_export(output.absolute(), data)
    click.echo(f"exported {conv.id} ({len(conv.messages)} messages) to {output}", err=True)


@click.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--id", "conversation_id", help="Import under this id instead.")
@click.option("--salvage", is_flag=True, help="A damaged transcript (a file `repair` moved "
              "aside, or a cut or garbled export): import the messages before the first break.")
@click.pass_obj
def import_cmd(env: Env, path: Path, conversation_id: str | None, salvage: bool) -> None:
    """Import a chatstate export, or OpenAI messages as a JSON list or jsonl.

    A file that `repair` moved aside imports back as it is (a json store's file is an
    export); a damaged one with --salvage, up to its first break.
    """
    from chatstate.core.transcript import validate_id
    from chatstate.errors import ConflictError
    from chatstate.ops.transfer import import_into, read_import

    if salvage:
        salvage_into(env.store(), path, conversation_id)
        return

    imported = read_import(path)
    conv = imported.conversation
    if conversation_id:
        conv.id = validate_id(conversation_id)
    try:
        import_into(env.store(), imported)
    except ConflictError as exc:
        fail(f"{exc}; nothing was imported. Import it under another id with --id NEW_ID.")
    click.echo(conv.id)
    click.echo(f"imported {len(imported.messages)} messages as {conv.id}", err=True)


@click.command()
@click.argument("conversation_id", metavar="ID")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def rm(env: Env, conversation_id: str, yes: bool) -> None:
    """Delete a conversation (asks first; --yes where there is no terminal to ask on)."""
    store = env.store()
    conv = store.load(conversation_id)
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"rm would delete {conv.id} ({len(conv.messages)} "
                                   "messages) and there is no terminal to ask on; nothing was "
                                   "deleted. Add --yes to delete it.")
        if not click.confirm(f"delete {conv.id} ({len(conv.messages)} messages)?"):
            fail(f"not deleted: {conv.id} is kept as it was", 1)  # declined: not an interrupt
    store.delete(conversation_id)
    click.echo(f"deleted {conversation_id}", err=True)


def parse_age(text: str) -> timedelta:
    match = re.fullmatch(r"(\d+)\s*([smhdw]?)", text.strip())
    if not match or (not match.group(2) and int(match.group(1)) != 0):
        raise click.BadParameter(f"{text!r}: use a number and a unit, e.g. 30d, 12h, 2w, 10m")
    if not match.group(2):
        return timedelta(0)
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    return timedelta(**{unit[match.group(2)]: int(match.group(1))})


@click.command()
@click.option("--older-than", "older_than", required=True, metavar="AGE",
              help="e.g. 30d, 12h, 2w (by last update).")
@click.option("--yes", is_flag=True, help="Really delete (otherwise a dry run).")
@click.pass_obj
def prune(env: Env, older_than: str, yes: bool) -> None:
    """Retention: delete conversations not updated for AGE. A dry run unless --yes."""
    cutoff = datetime.now(timezone.utc) - parse_age(older_than)
    store = env.store()
    old = [s for s in store.list_conversations()
           if s.updated_at and datetime.fromisoformat(s.updated_at.replace("Z", "+00:00"))
           < cutoff]
    for s in old:
        if yes:
            store.delete(s.id)
        click.echo(f"{'deleted' if yes else 'would delete'} {s.id} (updated {s.updated_at})")
    if not yes:
        click.echo(f"dry run: {len(old)} conversation(s) older than {older_than}; add --yes "
                   "to delete them", err=True)


@click.command()
@click.option("--grace", default="1h", show_default=True, metavar="AGE",
              help="Keep blobs stored (or stored again) more recently than this "
              "(at least 10m unless --force).")
@click.option("--force", is_flag=True, help="Accept a grace shorter than 10m.")
@click.option("--yes", is_flag=True, help="Really remove (otherwise a dry run).")
@click.pass_obj
def gc(env: Env, grace: str, force: bool, yes: bool) -> None:
    """Remove images and files that no message or partial reply names any more.

    Deleting or pruning a conversation leaves its attachments in the blob area (another
    conversation may name the same one). Every conversation is read first: a damaged one
    stops gc before anything is removed. A dry run unless --yes.
    """
    from chatstate.ops.blobgc import MIN_GRACE, collect_blobs

    try:
        seconds = parse_age(grace).total_seconds()
    except click.BadParameter as exc:
        exc.param_hint = "--grace"
        raise
    if seconds < MIN_GRACE and not force:
        raise click.BadParameter(
            f"{grace!r} is shorter than a turn can take (a turn stores its blobs before the "
            f"message naming them); use at least 10m, or add --force", param_hint="--grace")
    sweep = collect_blobs(env.store(), grace=seconds, dry_run=not yes)
    for sha256 in sweep.removed:
        click.echo(f"{'removed' if yes else 'would remove'} blob {sha256}")
    size = f"{sweep.freed / (1 << 20):.1f} MiB" if sweep.freed >= 1 << 20 else \
        f"{sweep.freed} bytes"
    click.echo(f"{len(sweep.removed)} of {sweep.held} blob(s) {'removed' if yes else 'unnamed'}"
               f" ({size}); {sweep.named} named by a message, {len(sweep.young)} unnamed but "
               f"younger than {grace}", err=True)
    if not yes and sweep.removed:
        click.echo("dry run: add --yes to remove them", err=True)


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.pass_obj
def search(env: Env, text: str, limit: int) -> None:
    """Full-text search over every transcript; prints ID#SEQ: text per matching message.

    sqlite stores use FTS5 and match TEXT as a phrase of whole words; other stores
    scan every transcript for TEXT as a substring. Both ignore case.
    """
    from chatstate.stores import Searchable

    store = env.reader()
    if isinstance(store, Searchable):  # an optional part of the Store protocol
        hits = store.search(text, limit=limit)
    else:
        from chatstate.errors import CorruptTranscriptError

        hits = []
        for summary in store.list_conversations():
            try:
                messages = store.load(summary.id).messages
            except CorruptTranscriptError as exc:  # one damaged transcript hides no others
                click.echo(f"skipped a damaged conversation: {exc}", err=True)
                continue
            hits += [(summary.id, m.seq, m.text) for m in messages  # parts: their text
                     if text.lower() in m.text.lower()]
            if len(hits) >= limit:
                break
    for cid, seq, content in hits[:limit]:
        click.echo(f"{cid}#{seq}: {neutralise(' '.join(content.split())[:120])}")
    if not hits:
        click.echo("no matches", err=True)


@click.command()
@click.argument("conversation_id", metavar="ID")
@click.option("--force", is_flag=True, help="Quarantine it even if it loads and verifies.")
@click.option("--salvage", is_flag=True, help="Then store the messages before the first "
              "break again, as a new conversation (ID-salvaged, or --as).")
@click.option("--as", "new_id", metavar="NEW_ID", help="With --salvage: the new id.")
@click.pass_obj
def repair(env: Env, conversation_id: str, force: bool, salvage: bool,
           new_id: str | None) -> None:
    """Quarantine a damaged transcript (moved aside, never deleted).

    A conversation that loads and verifies is left alone unless --force. With --salvage,
    the verified messages before the first break become a new conversation; the damaged
    data stays in the quarantine exactly as it was.
    """
    if new_id and not salvage:
        raise click.UsageError("--as names the salvaged conversation; add --salvage")
    from chatstate.errors import CorruptTranscriptError
    from chatstate.stores import Quarantines

    store = env.store()
    quarantine = store.quarantine if isinstance(store, Quarantines) else None  # optional part
    if quarantine is None:
        fail(f"{store.url}: this store has no repair; copy the damaged object aside by hand")
        return
    if not force:
        try:
            conv = store.load(conversation_id)
        except CorruptTranscriptError as exc:
            click.echo(f"damaged: {exc}", err=True)
        else:
            fail(f"{conversation_id!r} loads and its hash chain verifies ({len(conv.messages)} "
                 "messages): there is nothing to repair. Use --force to move it aside anyway.")
    where = quarantine(conversation_id)
    click.echo(f"moved {conversation_id} to {where}; the conversation id is free again",
               err=True)
    if salvage:
        moved = Path(where)
        if not moved.is_file():
            fail(f"{where} is not a local file, so it cannot be salvaged here: copy it to a "
                 "file and run `chatstate import --salvage FILE`")
        salvage_into(store, moved, new_id or f"{conversation_id}-salvaged")


def salvage_into(store: Store, path: Path, new_id: str | None) -> None:
    """Import the verified prefix of the transcript in ``path`` and say what was kept."""
    from chatstate.errors import ConflictError
    from chatstate.ops.salvage import salvage_file
    from chatstate.ops.transfer import Imported, import_into

    found = salvage_file(path, new_id)
    conv = found.conversation
    try:
        import_into(store, Imported(conv, conv.messages))
    except ConflictError as exc:
        fail(f"{exc}; nothing was salvaged. Choose another id (--as / --id NEW_ID).")
    why = f"; it stops where {found.stopped}" if found.stopped else ""
    click.echo(conv.id)
    click.echo(f"salvaged {len(conv.messages)} of the {found.found} message(s) read from "
               f"{path} as {conv.id}{why}; {path} was only read", err=True)
