"""`chatstate drill`: kill -9 a writer again and again; prove nothing acknowledged was lost."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import click

from chatstate.cli.common import Env, describe_store, fail


@click.command()
@click.option("--store", "store_url", metavar="URL",
              help="The store to drill (default: the global --store / CHATSTATE_STORE).")
@click.option("--all", "all_stores", is_flag=True,
              help="Drill json and sqlite stores in a fresh directory (see --dir), and s3 "
                   "when --s3 / CHATSTATE_DRILL_S3 names a bucket or the store is s3.")
@click.option("--dir", "directory", metavar="DIR", type=click.Path(file_okay=False),
              help="With --all: where the drill's json/sqlite stores go (default: the "
                   "directory of the configured store). Removed afterwards.")
@click.option("--s3", "s3_url", metavar="URL", envvar="CHATSTATE_DRILL_S3", show_envvar=True,
              help="With --all: an s3:// store URL to drill too.")
@click.option("--trials", type=click.IntRange(1), default=50, show_default=True,
              help="Writers to kill, per store.")
@click.option("--seed", type=int, default=None,
              help="Seed the kill plans and the writers' choices (printed in the report); "
                   "where each kill lands still depends on timing.")
@click.option("--trial-timeout", type=click.FloatRange(1), default=20.0, show_default=True,
              help="Seconds a writer may take to reach its kill point.")
@click.option("--max-seconds", type=click.FloatRange(1), default=900.0, show_default=True,
              help="Stop starting trials after this long (all stores together).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option("--serve", "serve_mode", is_flag=True, help="Drill `chatstate serve` instead: "
              "SIGKILL the proxy under concurrent streams (needs the serve extra).")
@click.option("--clients", type=click.IntRange(1), default=8, show_default=True,
              help="With --serve: concurrent streamed conversations per trial.")
@click.option("--identity", type=click.Choice(["header", "url", "none"]), default="header",
              show_default=True, help="With --serve: how clients name their conversation: "
              "the X-Chatstate-Conversation header, the base URL (/c/<id>/v1), or nothing "
              "(found by its history within the client token's namespace).")
@click.option("--api", type=click.Choice(["chat", "responses", "anthropic"]), default="chat",
              show_default=True, help="With --serve: the wire API the clients stream "
              "(chat completions, OpenAI Responses or Anthropic Messages).")
@click.option("--tools", is_flag=True,
              help="Drill the tool loop instead: kill a writer at every step of it, then "
                   "count duplicated side effects and orphaned calls (both must be 0).")
@click.option("--mcp", "mcp", is_flag=True,
              help="With --tools: the tool with side effects is an MCP server's (the "
                   "drill's own, over stdio; needs the mcp extra).")
@click.option("--encrypted", is_flag=True,
              help="Drill encrypted stores: the configured key, else a fresh one for this "
                   "drill (its stores must be new then, as with --all).")
@click.option("--rekey", is_flag=True,
              help="With --encrypted: after the trials, SIGKILL `chatstate rekey` in place "
                   "at random points while writers append, run it to completion, and prove "
                   "every acknowledged message is there once, every record is under the new "
                   "key and the old key is refused; rotations to fresh keys until "
                   "--rekey-kills, then back to the drill's key. It re-encrypts the whole "
                   "store: the store must be the drill's own (--all, or an empty --store).")
@click.option("--rekey-kills", type=click.IntRange(1), default=10, show_default=True,
              help="With --rekey: rekey processes to SIGKILL, per store.")
@click.pass_obj
def drill(env: Env, store_url: str | None, all_stores: bool, directory: str | None,
          s3_url: str | None, trials: int, seed: int | None, trial_timeout: float,
          max_seconds: float, as_json: bool, serve_mode: bool, clients: int,
          identity: str, api: str, tools: bool, mcp: bool, encrypted: bool, rekey: bool,
          rekey_kills: int) -> None:
    """SIGKILL a writer again and again; prove nothing acknowledged was lost.

    Starts the built-in fake model, then TRIALS times forks a writer that holds
    streamed and plain conversations (ids drill-<run id>-<n>), SIGKILLs it
    before the model call, mid-stream or inside a store write, and checks the
    store from a fresh open in another process: every transcript loads and
    verifies, every acknowledged message is there once, everything rendered
    is stored, interrupted turns are reported and retry() completes them, no
    temp file or lock is left. The drill's conversations are deleted at the
    end; no other conversation is read or written.

    With --tools, each writer runs a tool loop (an idempotent tool and one that
    appends to a file) and is killed while a tool runs, between a stored result
    and the next model call, or at random; the drill proves no call is left
    without its result (stored or sent), no non-idempotent tool ran twice, and
    every acknowledged message is still there. With --mcp that tool is an MCP
    server's, and duplicates count calls the server received twice.

    With --encrypted --rekey, a rekey phase follows the trials: `chatstate rekey` in
    place is SIGKILLed at random moments of its run while writers are killed
    meanwhile, then run to completion; from a fresh open with the new key alone every
    acknowledged message is there once and verifies, every record is sealed by the
    new key, the encryption mark names only it and the old key is refused.

    Exit status 0 when nothing was lost, corrupt or duplicated and no other
    problem was found; 1 otherwise. --json prints the result of one store as
    one object, or {"ok": ..., "stores": [...]} with --all.
    """
    from chatstate.drill import DrillOptions, run_drill
    from chatstate.stores import default_store_url

    if mcp and not tools:
        raise click.UsageError("--mcp goes with --tools: drill --tools --mcp")
    if rekey and (not encrypted or serve_mode or tools):
        raise click.UsageError("--rekey goes with --encrypted, and not with --serve or "
                               "--tools: drill --encrypted --rekey")

    configured = store_url or env.store_url or default_store_url()
    if encrypted:
        from chatstate.stores.codec import new_key
        from chatstate.stores.keys import configured as key_configured

        if not key_configured():  # the writers inherit it; it is gone with this process
            os.environ["CHATSTATE_ENCRYPTION_KEY"] = new_key()
    scratch: Path | None = None
    if all_stores:
        scratch = _scratch_dir(directory, configured)
        urls = [f"json://{scratch}/json", f"sqlite://{scratch}/drill.db"]
        s3 = s3_url or (configured if configured.startswith("s3://") else None)
        urls += [s3] if s3 else []
    else:
        urls = [configured]
    results: list[Any] = []
    previous = _term_interrupts()
    try:
        for url in urls:
            rewrites = _guard(env, url)
            if rekey and not rewrites:
                if not all_stores:
                    fail(f"drill --rekey: {url.split('?', 1)[0]} cannot be re-keyed in place "
                         "(`chatstate rekey` refuses it; its copy form, --from/--to, "
                         "re-encrypts it): nothing was changed", code=2)
                click.echo(f"drill --rekey: no rekey phase on {url.split('?', 1)[0]}: it "
                           "cannot be re-keyed in place (rekey --from/--to re-encrypts it)",
                           err=True)
            if serve_mode:
                results.append(_serve_drill(url, trials, clients, seed, identity, api))
                continue
            left = max_seconds - sum(r.seconds for r in results)
            if tools:
                results.append(_tool_drill(url, trials, seed, trial_timeout, max(left, 1.0),
                                           mcp))
                continue
            opts = DrillOptions(trials=trials, seed=seed, trial_timeout=trial_timeout,
                                max_seconds=max(left, 1.0),
                                rekey=rekey_kills if rekey and rewrites else 0,
                                allow_ephemeral=env.allow_ephemeral)
            results.append(run_drill(url, opts, progress=_progress(trials)))
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if serve_mode:
        from chatstate.drill.serve_drill import render_serve

        click.echo(json.dumps([r.to_dict() for r in results], indent=2) if as_json
                   else render_serve(results))
    elif tools:
        _print_tools(results, as_json, all_stores)
    else:
        _print(results, as_json, all_stores)
    if not all(r.ok for r in results):
        raise click.exceptions.Exit(1)


def _serve_drill(url: str, trials: int, clients: int, seed: int | None,
                 identity: str, api: str = "chat") -> Any:
    from chatstate.drill.serve_drill import run_serve_drill

    def show(result: Any) -> None:
        click.echo(f"drill serve {result.store}: {result.trials}/{trials} kills, "
                   f"{result.acked_turns} turns received whole, {result.lost} lost", err=True)

    return run_serve_drill(url, trials=trials, clients=clients, seed=seed, identity=identity,
                           progress=show, api=api)


def _term_interrupts() -> Any:
    """Let SIGTERM (a CI timeout, a service stop) clean up like Ctrl-C: kill the writer,
    delete the drill's conversations. Returns the previous handler (None if not main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _scratch_dir(directory: str | None, configured: str) -> Path:
    if directory is None:
        if configured.startswith(("json://", "sqlite://")):
            parsed = urlparse(configured)
            path = Path(parsed.netloc + parsed.path)
            directory = str(path.parent)
        else:
            fail(f"--all needs --dir when the configured store is not local ({configured})",
                 code=2)
    scratch = Path(str(directory)).absolute() / f"chatstate-drill-{secrets.token_hex(4)}"
    scratch.mkdir(mode=0o700, parents=True)
    return scratch


def _guard(env: Env, url: str) -> bool:
    """The durability guard and the store's own recovery, once, before the first writer.
    Whether the store can be re-keyed in place (``Rewrites``), for ``--rekey``."""
    from chatstate.stores import open_store
    from chatstate.stores.base import Rewrites
    from chatstate.stores.forwarding import ForwardingStore

    store = open_store(url, allow_ephemeral=env.allow_ephemeral)
    try:
        describe_store(store)
        inner = store.inner if isinstance(store, ForwardingStore) else store
        return isinstance(inner, Rewrites)
    finally:
        store.close()


def _progress(trials: int) -> Any:
    step = max(1, trials // 10)

    def show(result: Any) -> None:
        if result.trials % step == 0 or result.trials == trials:
            click.echo(f"drill {result.store}: {result.trials}/{trials} trials, "
                       f"{result.acked} acknowledged, {result.problem_count}"
                       " problems", err=True)
    return show


def _print(results: list[Any], as_json: bool, all_stores: bool) -> None:
    if as_json:
        doc = {"ok": all(r.ok for r in results), "stores": [r.to_dict() for r in results]} \
            if all_stores else results[0].to_dict()
        click.echo(json.dumps(doc, indent=2))
        return
    from rich.console import Console

    from chatstate.drill.report import render

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    render(results, console)


def _tool_drill(url: str, trials: int, seed: int | None, trial_timeout: float,
                max_seconds: float, mcp: bool = False) -> Any:
    from chatstate.drill.tooldrill import run_tool_drill

    def show(result: Any) -> None:
        if result.kills % max(1, trials // 10) == 0:
            click.echo(f"drill --tools {result.store}: {result.kills}/{trials} kills, "
                       f"{len(result.problems)} problems", err=True)
    return run_tool_drill(url, trials=trials, seed=seed, trial_timeout=trial_timeout,
                          max_seconds=max_seconds, progress=show,
                          mcp="builtin" if mcp else None)


def _print_tools(results: list[Any], as_json: bool, all_stores: bool) -> None:
    if as_json:
        doc = {"ok": all(r.ok for r in results), "stores": [r.to_dict() for r in results]} \
            if all_stores else results[0].to_dict()
        click.echo(json.dumps(doc, indent=2))
        return
    for r in results:
        verdict = "ok" if r.ok else "FAILED"
        click.echo(f"{r.store}: {verdict}: {r.kills} kills, {r.calls} tool calls, "
                   f"{r.tool_runs} side effects, {r.duplicates} duplicates, "
                   f"{r.orphans} orphans, {r.lost} acknowledged messages lost, "
                   f"{r.unknown} outcomes unknown, {r.requests} model requests "
                   f"(seed {r.seed}, {r.seconds:.0f} s)")
        click.echo("  kills by step: " + ", ".join(f"{k} {v}" for k, v in sorted(r.steps.items())))
        if r.stopped_early:
            click.echo(f"  stopped early: {r.stopped_early}")
        for problem in r.problems[:20]:
            click.echo(f"  problem: {problem}")
