"""Options `chat` and `ask` share for daily use: a template, the context window, --raw, --quiet.

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

    def resolve(self, system: str | None, model: str | None
                ) -> tuple[str | None, str | None, dict[str, Any]]:
        """(system, model, params) after the template; explicit --system/--model win."""
        if self.template is None:
            if self.values:
                raise click.UsageError("-p fills a template's placeholders: add -t NAME")
            return system, model, {}
        from chatstate.ops import templates

        tpl = templates.load(self.template)
        return (system if system is not None else tpl.render(self.values),
                model or tpl.model, dict(tpl.params))

    def configure(self, chat: Any, params: dict[str, Any]) -> None:
        chat.context_window = self.context_window
        chat.params.update(params)

    def markdown(self) -> bool:
        """Render Markdown: stdout is a terminal that takes colour, and --raw is off."""
        return use_markdown(self.raw)


def use_markdown(raw: bool) -> bool:
    return (not raw and sys.stdout.isatty() and "NO_COLOR" not in os.environ
            and os.environ.get("TERM", "") != "dumb")


def daily_options(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs["daily"] = Daily(
            template=kwargs.pop("template"), values=dict(kwargs.pop("values")),
            context_window=kwargs.pop("context_window"), raw=kwargs.pop("raw"),
            quiet=kwargs.pop("quiet"))
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
        click.option("--raw", is_flag=True, help="Print replies as plain text (no Markdown)."),
        click.option("--quiet", "-q", is_flag=True, help="No token and speed line after "
                     "a reply."),
    ]):
        command = decorator(command)
    return command
