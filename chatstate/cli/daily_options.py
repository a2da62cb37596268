"""Options `chat` and `ask` share for daily use: a template, the context window, model
options, --raw, --quiet, -f files and --no-log.

``daily_options`` adds them to a command and hands them over as one ``daily``
argument, so the commands' signatures grow by one name, not six.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click


@dataclass
class Daily:
    template: str | None = None
    values: dict[str, str] = field(default_factory=dict)
    context_window: int | None = None
    raw: bool = False
    quiet: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    no_log: bool = False

    def resolve(self, system: str | None, model: str | None
                ) -> tuple[str | None, str | None, dict[str, Any]]:
        """(system, model, params) after the template and config.toml; explicit
        --system/--model and the model options (--temperature, --max-tokens, -o) win over
        the template's, which win over config.toml's [options]. --model goes through
        config.toml's [aliases]."""
        config = self.config()
        if self.template is None:
            if self.values:
                raise click.UsageError("-p fills a template's placeholders: add -t NAME")
            return system, config.resolve_model(model), {**config.options, **self.options}
        from chatstate.ops import templates

        tpl = templates.load(self.template)
        rendered = tpl.render(self.values) or None  # a template may have no system prompt
        return (system if system is not None else rendered,
                config.resolve_model(model or tpl.model),
                {**config.options, **tpl.params, **self.options})

    @staticmethod
    def config() -> Any:
        from chatstate.cli.common import fail
        from chatstate.core.config import load
        from chatstate.errors import ConfigurationError

        try:
            return load()
        except ConfigurationError as exc:
            fail(str(exc), code=2)  # one line: the file, the line, the fix
            raise

    def fragment_parts(self) -> list[dict[str, Any]]:
        """The -f files as text parts, read and checked now (before anything is stored)."""
        if not self.files:
            return []
        from chatstate.core.fragments import FRAGMENTS_LIMIT, fragments
        from chatstate.errors import InvalidInput

        try:
            return fragments(self.files, limit=FRAGMENTS_LIMIT,
                             stdin=lambda: sys.stdin.buffer.read(FRAGMENTS_LIMIT + 1))
        except InvalidInput as exc:
            raise click.UsageError(str(exc)) from exc

    def configure(self, chat: Any, params: dict[str, Any]) -> None:
        from chatstate.session.context import ENV_WINDOW

        window = self.context_window
        if window is None and not os.environ.get(ENV_WINDOW):
            window = self.config().context_window  # config.toml is below the environment
        chat.context_window = window
        chat.params.update(params)

    def markdown(self) -> bool:
        """Render Markdown: stdout is a terminal that takes colour, and --raw is off."""
        return use_markdown(self.raw)


def use_markdown(raw: bool) -> bool:
    return (not raw and sys.stdout.isatty() and "NO_COLOR" not in os.environ
            and os.environ.get("TERM", "") != "dumb")


def model_options(temperature: float | None, max_tokens: int | None,
                  pairs: Any) -> dict[str, Any]:
    """The request parameters the command line sets; -o KEY VALUE for any other one."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        from chatstate.ops.templates import NOT_PARAMS, parse_value  # only with an -o

        if not key or key in NOT_PARAMS:
            shown = key or "''"
            raise click.UsageError(f"-o {shown} is not a model parameter: use "
                                   "--model for the model, and a KEY such as top_p or seed")

        out[key] = parse_value(value)
    if temperature is not None:
        out["temperature"] = temperature
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    return out


def daily_options(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs["daily"] = Daily(
            template=kwargs.pop("template"), values=dict(kwargs.pop("values")),
            context_window=kwargs.pop("context_window"), raw=kwargs.pop("raw"),
            quiet=kwargs.pop("quiet"), files=kwargs.pop("files"), no_log=kwargs.pop("no_log"),
            options=model_options(kwargs.pop("temperature"), kwargs.pop("max_tokens"),
                                  kwargs.pop("option")))
        return f(*args, **kwargs)

    for decorator in reversed([
        click.option("-t", "--template", metavar="NAME",
                     help="Start from a saved template (system prompt, model, params)."),
        click.option("-p", "--placeholder", "values", nargs=2, multiple=True,
                     metavar="KEY VALUE", help="Fill {KEY} in the template's system prompt."),
        click.option("--context-window", type=click.IntRange(min=1), metavar="N",
                     help="The model's context window in tokens (default: "
                          "CHATSTATE_CONTEXT_WINDOW, else learned from the provider, else a "
                          "built-in table). Older turns are left out of the request, never "
                          "out of the store."),
        click.option("--temperature", type=float, metavar="T",
                     help="Sampling temperature (stored with the turn)."),
        click.option("--max-tokens", type=click.IntRange(min=1), metavar="N",
                     help="The most tokens the reply may have (stored with the turn)."),
        click.option("-o", "--option", nargs=2, multiple=True, metavar="KEY VALUE",
                     help="Any other model parameter, as llm's -o: VALUE is read as JSON "
                          "when it parses (0.5, true, [\"END\"]), else as text."),
        click.option("--raw", is_flag=True, help="Print replies as plain text (no Markdown)."),
        click.option("--quiet", "-q", is_flag=True, help="No notices on stderr and no token "
                     "and speed line after a reply (as chatstate -q)."),
        click.option("-f", "--fragment", "files", multiple=True, metavar="PATH",
                     help="Put a file's text in the message (repeatable): a path, a "
                          "directory (its files), a glob ('src/**/*.py'), or - for stdin; "
                          "UTF-8 text only, 1 MiB in all."),
        click.option("--no-log", is_flag=True, help="Send the turn but do not store it (it "
                     "is kept nowhere; the conversation so far is read as usual)."),
    ]):
        command = decorator(command)
    return command
