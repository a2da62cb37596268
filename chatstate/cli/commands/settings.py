"""`chatstate models` and `chatstate config path|show`: what is configured, and where from."""

from __future__ import annotations

import json

import click

from chatstate.cli.common import Env, fail
from chatstate.cli.turns import api_option


@click.command()
@click.option("--base-url", metavar="URL", help="The endpoint to ask (default: as `ask` uses).")
@api_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object: models, default.")
@click.pass_obj
def models(env: Env, base_url: str | None, as_json: bool) -> None:
    """List the endpoint's models (GET /models); * marks the configured default."""
    from chatstate.adapter import make_adapter
    from chatstate.core.config import load
    from chatstate.core.redact import redact_url

    config = load()
    adapter = make_adapter(base_url=base_url)
    try:
        names = adapter.list_models()
    finally:
        adapter.close()
    default = config.resolve_model(adapter.model)
    if as_json:
        click.echo(json.dumps({"models": names, "default": default}))
        return
    for name in names:
        click.echo(f"{'*' if name == default else ' '} {name}")
    where = redact_url(adapter.backend.endpoint.removesuffix(adapter.dialect.path))
    if not names:
        env.notice(f"{where} lists no models")
    elif default not in names:
        env.notice(f"the default model {default!r} is not among the {len(names)} that {where} "
                   "lists: set another with --model, CHATSTATE_MODEL or model in config.toml")
    else:
        env.notice(f"* the default model ({len(names)} listed by {where})")


@click.group()
def config() -> None:
    """Where the config file is, and the settings in effect (secrets hidden)."""


@config.command()
def path() -> None:
    """Print the path of config.toml (it need not exist yet)."""
    from chatstate.core.config import config_path

    click.echo(str(config_path()))


@config.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
def show(env: Env, as_json: bool) -> None:
    """The settings in effect below the command line, and where each comes from.

    The API key is never printed: only whether it is set and where."""
    from chatstate.core.config import load, sources
    from chatstate.core.redact import redact_url, scrub
    from chatstate.errors import ConfigurationError

    try:
        cfg = load()
        found = sources()
    except ConfigurationError as exc:
        fail(str(exc), code=2)
        return
    shown: dict[str, object] = {}
    for name, (value, source) in found.items():
        if name == "api_key":
            text = "(set)" if value else "(not set)"
        elif value is None:
            text = "(default)"
        else:
            text = redact_url(value) if "://" in value else scrub(value)
        shown[name] = {"value": text, "from": scrub(source)}
    for key in ("context_window", "options", "aliases"):
        value = cfg.as_dict().get(key)
        if value is not None:
            shown[key] = {"value": json.loads(scrub(json.dumps(value))), "from": str(cfg.path)}
    if as_json:
        click.echo(json.dumps({"config_file": str(cfg.path), "exists": cfg.exists,
                               "settings": shown}))
        return
    click.echo(f"config file {cfg.path}" + ("" if cfg.exists else " (not there)"))
    for name, entry in shown.items():
        assert isinstance(entry, dict)
        value = entry["value"]
        text = value if isinstance(value, str) else json.dumps(value)
        click.echo(f"{name} = {text}  [{entry['from']}]")
