"""``chatstate serve``: run the persisting OpenAI-compatible proxy under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from pathlib import Path
from typing import Any

import click

from chatstate.cli.common import Env, fail


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _size(text: str) -> int:
    units = {"kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "kb": 1000, "mb": 1000 ** 2}
    lowered = text.strip().lower()
    for suffix, factor in units.items():
        if lowered.endswith(suffix):
            return int(float(lowered[:-len(suffix)]) * factor)
    return int(lowered)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Any non-loopback address needs client tokens.")
@click.option("--port", default=8080, show_default=True, type=int, help="0 picks a free port.")
@click.option("--upstream", metavar="URL", help="The provider's base URL (default: the "
              "configured base URL). 'fake' runs the built-in fake model.")
@click.option("--token", "tokens", multiple=True, metavar="TOKEN",
              help="A client token (repeatable; also CHATSTATE_SERVE_TOKENS, comma-separated, "
              "or --token-file). Each token is a namespace of its own.")
@click.option("--token-file", "token_files", multiple=True, metavar="PATH",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Read client tokens from a file, one a line (not shown in ps).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests whose Host header is NAME (repeatable; loopback "
              "names, the bound host and IP addresses are always answered; '*' any).")
@click.option("--pass-client-key", is_flag=True, help="Forward the client's Authorization "
              "header upstream (tokens are then read from X-Chatstate-Token).")
@click.option("--ready-upstream", is_flag=True, help="/readyz also checks GET /models upstream.")
@click.option("--max-body", default="32MiB", show_default=True, help="Request size limit (413).")
@click.option("--drain", default=30, show_default=True, type=int,
              help="Seconds SIGTERM waits for streams in flight.")
@click.option("--lease-wait", default=0.0, show_default=True, type=click.FloatRange(min=0),
              metavar="SECONDS",
              help="How long a request waits for another live writer of its conversation "
              "(another proxy, a REPL) before it is answered 409 conversation_in_use.")
@click.option("--max-messages", default=10_000, show_default=True,
              type=click.IntRange(min=1), help="Messages one request may carry (413).")
@click.option("--max-depth", default=64, show_default=True, type=click.IntRange(min=2),
              help="How deep a request's JSON may nest (400).")
@click.option("--max-concurrent", type=click.IntRange(min=1), metavar="N",
              help="Requests in flight per client token; more are answered 429 "
              "[default: no limit].")
@click.option("--rate", metavar="N[/s|/min|/h]",
              help="Requests per client token (e.g. 120/min); more are answered 429 with "
              "Retry-After [default: no limit].")
@click.option("--idle-timeout", default=5, show_default=True, type=click.IntRange(min=1),
              metavar="SECONDS", help="Close a connection idle this long (no request).")
@click.option("--header-timeout", default=10.0, show_default=True,
              type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Close a connection whose request headers take longer than this.")
@click.option("--ready-cache", default=1.0, show_default=True, type=click.FloatRange(min=0),
              metavar="SECONDS", help="How long /readyz reuses its last store probe.")
@click.pass_obj
def serve(env: Env, host: str, port: int, upstream: str | None, tokens: tuple[str, ...],
          token_files: tuple[Path, ...], allow_hosts: tuple[str, ...], pass_client_key: bool,
          ready_upstream: bool, max_body: str, drain: int, lease_wait: float,
          max_messages: int, max_depth: int, max_concurrent: int | None, rate: str | None,
          idle_timeout: int, header_timeout: float, ready_cache: float) -> None:
    """Run an OpenAI-compatible proxy that stores every conversation before a byte reaches
    the client. Point a client's base URL at http://HOST:PORT/v1."""
    try:
        import uvicorn

        from chatstate.serve import ServeConfig, check_tokens, create_app, with_access_log
        from chatstate.serve._limits import parse_rate
        from chatstate.serve._timeouts import h11_protocol
    except ModuleNotFoundError as exc:
        fail(f"chatstate serve needs the serve extra ({exc.name} is missing): "
             "pip install 'chatstate[serve]'")
    from chatstate.adapter.settings import DEFAULT_BASE_URL, ModelSettings

    try:
        all_tokens = check_tokens([*tokens, *_file_tokens(token_files), *_env_tokens()])
    except ValueError as exc:
        fail(str(exc), 2)
    if not _loopback(host) and not all_tokens:
        fail(f"refusing to listen on {host} without client tokens: anyone who can reach it "
             "could spend your API key. Pass --token (or CHATSTATE_SERVE_TOKENS), or bind "
             "127.0.0.1.", 2)
    try:
        per_second = None if rate is None else parse_rate(rate)
    except ValueError as exc:
        fail(str(exc), 2)
    settings = ModelSettings()
    fake: Any = None
    if upstream == "fake":
        from chatstate.testing import FakeModel

        fake = FakeModel().start()
        upstream = fake.base_url
    base = upstream or settings.base_url
    key = settings.api_key.get_secret_value() if settings.api_key else None
    if base.rstrip("/") == DEFAULT_BASE_URL and not key and not pass_client_key:
        fail("no API key for the OpenAI endpoint: set OPENAI_API_KEY (or CHATSTATE_API_KEY), "
             "or use --pass-client-key, or --upstream URL for another provider", 2)
    store = env.store()
    config = ServeConfig(store=store, upstream=base, api_key=key, tokens=all_tokens,
                         pass_client_key=pass_client_key, max_body=_size(max_body),
                         ready_upstream=ready_upstream, timeout=settings.timeout,
                         connect_timeout=settings.connect_timeout, lease_wait=lease_wait,
                         max_messages=max_messages, max_depth=max_depth,
                         max_concurrent=max_concurrent, rate=per_second,
                         ready_cache=ready_cache, allowed_hosts=[host, *allow_hosts])
    logging.getLogger("chatstate.serve").setLevel(logging.INFO)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # listening before the URL is printed: early clients queue, not fail
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        with_access_log(create_app(config)), log_level="warning", access_log=False,
        timeout_graceful_shutdown=max(1, drain), lifespan="on",
        http=h11_protocol(header_timeout), timeout_keep_alive=idle_timeout))
    shown_host = f"[{host}]" if ":" in host else host
    click.echo(f"serving on http://{shown_host}:{bound}/v1 (upstream {_shown(base)})",
               err=True)
    from chatstate.serve._gc import steady

    steady()  # the process's own collector setting: everything above lives until exit
    try:
        server.run(sockets=[sock])
    finally:
        if fake is not None:
            fake.close()


def _env_tokens() -> list[str]:
    raw = os.environ.get("CHATSTATE_SERVE_TOKENS")
    if raw is None:
        return []
    if not raw.strip():  # set but empty: an unset variable in a deploy file, say so
        return [raw]
    return [t.strip() for t in raw.replace(",", " ").split() if t.strip()]


def _file_tokens(paths: tuple[Path, ...]) -> list[str]:
    out: list[str] = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"--token-file {path}: cannot read it ({exc}): give a readable text file "
                 "with one token a line", 2)
        found = [line.strip() for line in lines
                 if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            fail(f"--token-file {path}: no token in it: put one token a line", 2)
        out += found
    return out


def _shown(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
