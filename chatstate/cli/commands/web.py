"""``chatstate web``: the read-only web view of the local store, on loopback."""

from __future__ import annotations

import functools
import socket
from pathlib import Path

import click

from chatstate.cli.common import Env, fail


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind: a loopback one (the view has no login; serve's /ui "
              "has, behind its tokens).")
@click.option("--port", default=8081, show_default=True, type=int, help="0 picks a free port.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests whose Host header is NAME (repeatable; loopback "
              "names and IP addresses are always answered).")
@click.option("--prices", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A price table (TOML, dollars per million tokens) for the usage page's "
              "costs, as `chatstate usage --prices`.")
@click.pass_obj
def web(env: Env, host: str, port: int, allow_hosts: tuple[str, ...],
        prices: Path | None) -> None:
    """Browse, search and verify the stored conversations in a browser (read-only)."""
    try:
        import uvicorn

        from chatstate.serve._auth import host_allowed
        from chatstate.web import WebConfig, create_app
    except ModuleNotFoundError as exc:
        fail(f"chatstate web needs the web extra ({exc.name} is missing): "
             "pip install 'chatstate[web]'")
    from chatstate.cli.commands.serve import _loopback
    from chatstate.ops.usage import load_prices

    if not _loopback(host):
        fail(f"refusing to serve the web view on {host}: it has no login, so anyone who can "
             "reach it could read every conversation. Bind 127.0.0.1, or run `chatstate "
             "serve --token ...` and open its /ui, which asks for a token.", 2)
    table = load_prices(prices) if prices else None
    config = WebConfig(store=env.store(), prices=table,
                       host_allowed=functools.partial(host_allowed,
                                                      allowed=[host, *allow_hosts]))
    app = create_app(config)
    app.state.web.warm()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           access_log=False, lifespan="off"))
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"web view on http://{shown}:{bound}/ (read-only)", err=True)
    server.run(sockets=[sock])
