"""`chatstate demo`: the main job, offline, honest, in a few seconds.

It holds a streamed conversation in the configured store against the built-in
fake model, SIGKILLs a second writer in the middle of its reply, reopens the
conversation, shows what recovery found, completes the interrupted turn with
retry, and replays the verified transcript.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from chatstate.cli.common import Env, fail
from chatstate.cli.render import neutralise

if TYPE_CHECKING:
    from chatstate.stores.base import Store


def step(text: str) -> None:
    sys.stdout.flush()
    click.secho(f"\n== {text}", bold=True, err=True)


@click.command()
@click.option("--kill-after", type=int, default=60, show_default=True,
              help="Characters the second writer renders before it is SIGKILLed.")
@click.pass_obj
def demo(env: Env, kill_after: int) -> None:
    """The main job, offline: stream, kill -9 mid-reply, recover, retry, replay."""
    from chatstate.core.transcript import new_id
    from chatstate.session.chat import Chat
    from chatstate.testing import FakeModel

    store = env.store()
    cid = new_id("demo")
    with FakeModel(chunk_delay=0.02, reply_words=12, model="fake-model") as fake:
        os.environ.setdefault("CHATSTATE_API_KEY", "offline-demo")
        chat = Chat(store, conversation_id=cid, base_url=fake.base_url, model="fake-model",
                    system="You are a terse assistant.")
        step(f"1. a streamed turn in {cid}: each delta is in the store before it is shown")
        stream_turn(chat.stream("What does chatstate promise?"))
        step("2. a second writer process streams a long reply; it is SIGKILLed mid-reply")
        fake.configure(reply_words=40)
        shown = kill_writer(store.url, cid, fake.base_url, kill_after, env.allow_ephemeral)
        click.echo(f"   the killed writer had rendered {len(shown)} characters", err=True)
        step("3. reopening the conversation is recovery")
        chat = Chat(store, conversation_id=cid, base_url=fake.base_url, model="fake-model")
        recovered = report_recovery(chat, shown)
        if recovered:
            step("4. retry() completes the interrupted turn under the same turn id")
            stream_turn(chat.retry_stream())
        step("5. replay from the store, hash chain verified")
        verified = replay(store, cid)
    click.echo(f"\nreplay it any time: chatstate replay {cid} --verify", err=True)
    if not (recovered and verified):
        fail("the demo did not show what it promises (see above); rerun with --debug and "
             "please report it")


def stream_turn(deltas: Any) -> None:
    sys.stdout.write("assistant> ")
    for delta in deltas:
        sys.stdout.write(neutralise(delta))
        sys.stdout.flush()
    sys.stdout.write("\n")


def kill_writer(store_url: str, cid: str, base_url: str, kill_after: int,
                allow_ephemeral: bool) -> str:
    cmd = [sys.executable, "-m", "chatstate", "--store", store_url, "ask", "--id", cid,
           "--base-url", base_url, "--model", "fake-model", "Tell me the long version."]
    env = dict(os.environ)
    if allow_ephemeral:  # the writer opens the same store, so it needs the same consent
        env["CHATSTATE_ALLOW_EPHEMERAL"] = "1"
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stderr is not None
    # a kill can land inside a multi-byte character: keep only whole characters
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    shown = ""
    deadline = time.monotonic() + 30
    while len(shown) < kill_after and time.monotonic() < deadline:
        chunk = os.read(child.stdout.fileno(), 64)
        if not chunk:
            break
        shown += decoder.decode(chunk)
    child.send_signal(signal.SIGKILL)
    child.wait()
    sys.stdout.write("writer> " + neutralise(shown) + "  <SIGKILL>\n")
    if not shown:
        said = child.stderr.read().decode(errors="replace").strip()
        click.echo(f"   the writer printed nothing before the kill; it said: {said}", err=True)
    return shown


def report_recovery(chat: Any, shown: str) -> bool:
    """Say what reopening found; True when the rendered text is a prefix of the stored one."""
    turn = chat.interrupted
    if turn is None:
        click.echo("   no interrupted turn: the writer finished before the kill, or never "
                   "stored its question", err=True)
        return False
    click.echo(f"   found: {turn.describe()}", err=True)
    stored = turn.partial.content if turn.partial is not None else ""
    ok = bool(shown) and stored.startswith(shown)
    click.echo(f"   the store holds {len(stored)} characters of the reply; everything the "
               f"writer rendered is a prefix of it: {'yes' if ok else 'NO'}", err=True)
    return ok


def replay(store: Store, cid: str) -> bool:
    conv = store.load(cid)
    for m in conv.messages:
        tag = " (partial, kept)" if m.status == "partial" else ""
        text = " ".join(m.text.split())
        click.echo(f"   [{m.seq}] {m.role}{tag}: {neutralise(text[:90])}"
                   f"{'…' if len(text) > 90 else ''}")
    bad = conv.verify()
    click.echo(f"   {len(conv.messages)} messages; hash chain "
               f"{'verified' if bad is None else f'BROKEN at seq {bad}'}", err=True)
    return bad is None
