"""Shared by `chat` and `ask`: pick the conversation, build the adapter, open the Chat."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from chatstate.cli.common import Env, fail

if TYPE_CHECKING:
    from chatstate.stores.base import Store

FAKE_MODELS = {"fake", "offline"}
FAKE_WORDS_ENV = "CHATSTATE_FAKE_REPLY_WORDS"
FAKE_DELAY_ENV = "CHATSTATE_FAKE_CHUNK_DELAY"


def _set_api(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--api is CHATSTATE_API for this run (the adapter's settings read it)."""
    if value is None:
        return
    from chatstate.adapter.dialects import dialect

    try:
        dialect(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    os.environ["CHATSTATE_API"] = value


api_option = click.option(
    "--api", metavar="API", expose_value=False, callback=_set_api,
    help="The model's wire API: chat_completions (default), responses or "
    "anthropic_messages (same as CHATSTATE_API).")
"""``--api``: the one option every command that talks to a model shares."""


def conversation_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--id / -c / --new / --model / --base-url / --system / --lease-wait, for chat and ask."""
    for decorator in reversed([
        click.option("--id", "conversation_id", metavar="ID",
                     help="Continue conversation ID, or create it."),
        click.option("-c", "--continue", "cont", is_flag=True,
                     help="Continue the most recently updated conversation."),
        click.option("--new", is_flag=True, help="Start a new conversation (the default)."),
        click.option("--model", "-m", metavar="M", help="Model name; 'fake' uses the "
                     "built-in offline fake model (also --offline), whose replies echo "
                     f"your message plus ${FAKE_WORDS_ENV} filler words (default 8)."),
        click.option("--offline", is_flag=True, help="Use the built-in fake model."),
        click.option("--base-url", metavar="URL", help="OpenAI-compatible endpoint "
                     "(default: CHATSTATE_BASE_URL / OPENAI_BASE_URL)."),
        api_option,
        click.option("--system", metavar="TEXT", help="System prompt for a new conversation."),
        click.option("--lease-wait", default=0.0, type=click.FloatRange(min=0),
                     metavar="SECONDS", help="How long a turn waits while another live "
                     "writer (a REPL, a script, chatstate serve) is replying in the "
                     "conversation; then it fails, storing nothing.  [default: 0]"),
    ]):
        f = decorator(f)
    return f


def pick_conversation(store: Store, conversation_id: str | None, cont: bool) -> str | None:
    if cont:
        latest = store.list_conversations(limit=1)
        if not latest:
            fail(f"there is no conversation to continue in {store.url}; start one with --new")
        return str(latest[0].id)
    return conversation_id


def valid_text(text: str, what: str) -> str:
    """``text`` if it can be stored; undecodable input (lone surrogates) is a usage error."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        try:  # an undecodable input byte, as Python smuggles it in (surrogateescape)
            shown = f"byte 0x{bad.encode('utf-8', 'surrogateescape').hex()}"
        except UnicodeEncodeError:
            shown = f"lone surrogate U+{ord(bad):04X}"
        raise click.UsageError(f"{what} is not valid UTF-8 ({shown} at character "
                               f"{exc.start}); nothing was stored") from exc
    return text


def fake_reply_words() -> int:
    """How many filler words the built-in fake adds to each reply (a longer, slower stream)."""
    raw = os.environ.get(FAKE_WORDS_ENV, "").strip()
    if not raw:
        return 8
    if not raw.isdigit():
        fail(f"{FAKE_WORDS_ENV}={raw!r} is not a whole number of words; unset it or use e.g. 200",
             code=2)
    return int(raw)


def fake_chunk_delay() -> float:
    """Seconds the built-in fake waits between chunks: none unless asked (a pasted 90 KB
    message would otherwise take minutes to echo back)."""
    raw = os.environ.get(FAKE_DELAY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        delay = float(raw)
    except ValueError:
        delay = -1.0
    if not 0 <= delay <= 10:
        fail(f"{FAKE_DELAY_ENV}={raw!r} is not a delay in seconds from 0 to 10; unset it or "
             "use e.g. 0.02", code=2)
    return delay


@contextlib.contextmanager
def open_chat(env: Env, *, conversation_id: str | None, cont: bool, new: bool,
              model: str | None, offline: bool, base_url: str | None,
              system: str | None, lease_wait: float = 0.0, no_log: bool = False
              ) -> Iterator[Any]:
    """A Chat over the configured store; with --model fake, a fake model for its lifetime.
    ``no_log``: the store is only read; the Chat's turns are kept nowhere (--no-log)."""
    from chatstate.session.chat import Chat

    if sum(bool(x) for x in (conversation_id, cont, new)) > 1:
        raise click.UsageError("choose one of --id, --continue and --new")
    store = env.store(writes=not no_log)
    cid = pick_conversation(store, conversation_id, cont)
    with contextlib.ExitStack() as stack:
        api_key = None
        if offline or (model or "").lower() in FAKE_MODELS:
            from chatstate.testing import FakeModel

            if model and model.lower() not in FAKE_MODELS:
                click.echo(f"note: --offline answers with the built-in fake model; --model "
                           f"{model} is not used", err=True)

            fake = stack.enter_context(FakeModel(chunk_delay=fake_chunk_delay(),
                                                 reply_words=fake_reply_words()))
            base_url, model, api_key = fake.base_url, "fake", "offline"
        chat = Chat(store, conversation_id=cid, model=model, base_url=base_url,
                    api_key=api_key, system=system, lease_wait=lease_wait)
        if system:
            _say_if_not_applied(chat, system)
        if no_log:
            from chatstate.session.unlogged import NOTICE, unlogged

            chat = unlogged(chat)
            click.echo(NOTICE, err=True)  # said even under -q: nothing of it will be kept
        from chatstate.cli import started

        started()  # the start-up of ask and chat ends here (app.OPENS_CHAT)
        yield chat


def _say_if_not_applied(chat: Any, system: str) -> None:
    """A system prompt (--system, or a template's) starts a new conversation only: said
    when a stored one goes on without it (the same prompt again, as a script that always
    passes it sends, is no news)."""
    messages = chat.messages
    if not messages:
        return
    first = messages[0]
    if first.role == "system" and first.content == system:
        return
    click.echo(f"note: the system prompt (--system or the template's) is for a new "
               f"conversation; {chat.conversation.id} has {len(messages)} message(s), so "
               "it was not applied (the REPL's /system adds one)", err=True)


attach_option = click.option(
    "-a", "--attach", "attach", multiple=True, metavar="PATH_OR_URL",
    help="Attach an image or file (repeatable): a path, or an image's http(s) URL. A UTF-8 "
         "text file goes as text naming the file; large images and files are stored once in "
         "the store's blob area.")


def attachments(sources: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """Content parts for ``-a/--attach``, read now: a bad path fails before anything is stored."""
    from chatstate.core.content import attachment
    from chatstate.errors import ChatstateError

    try:
        return [attachment(source) for source in sources]
    except ChatstateError as exc:
        raise click.UsageError(str(exc)) from exc
