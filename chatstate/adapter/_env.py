"""The adapter's configuration defaults, and reading the environment and a ``.env`` file
without pydantic-settings.

The defaults are written once, in ``PlainSettings``: ``ModelSettings``,
``RetryPolicy`` and the backends take theirs from ``DEFAULTS``.

Only what ModelSettings needs: variable names matched case-insensitively, empty
values treated as unset (``OPENAI_API_KEY=`` in .env.example means "no key"),
and the real environment ranked above the ``.env`` file as a whole. The
``.env`` syntax is the common subset: ``KEY=value`` lines, an optional
``export``, single or double quotes, ``#`` comments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# field -> the variables it is read from, first wins (CHATSTATE_* over OPENAI_*)
VARIABLES = {
    "model": ("CHATSTATE_MODEL",),
    "base_url": ("CHATSTATE_BASE_URL", "OPENAI_BASE_URL"),
    "api_key": ("CHATSTATE_API_KEY", "OPENAI_API_KEY"),
    "api": ("CHATSTATE_API",),
    **{name: (f"CHATSTATE_{name.upper()}",) for name in (
        "timeout", "connect_timeout", "max_retries", "backoff_base", "backoff_max",
        "retry_after_max")},
}
TEXT_FIELDS = frozenset({"model", "base_url", "api_key", "api"})


@dataclass(frozen=True)
class PlainSettings:
    """ModelSettings' values when nothing needs validating (text only, defaults else).

    Built without the pydantic model, whose class creation is a measurable part of
    a cold `chatstate ask`; same attribute names. Its defaults are the defaults of
    every setting (``DEFAULTS``)."""

    model: str = DEFAULT_MODEL
    base_url: str = DEFAULT_BASE_URL
    api_key: Any = None  # a pydantic SecretStr, never the bare key
    timeout: float | None = 60.0
    connect_timeout: float = 10.0
    max_retries: int = 3
    backoff_base: float = 0.5
    backoff_max: float = 20.0
    retry_after_max: float = 60.0
    api: str = "chat_completions"  # the dialect (chatstate.adapter.dialects), CHATSTATE_API
    model_fields_set: frozenset[str] = field(default=frozenset(), repr=False)


DEFAULTS = PlainSettings()


def resolve(overrides: Mapping[str, Any]) -> Any:
    """Settings from ``overrides`` > the environment > .env; validated by ModelSettings
    only when a value needs it (a number, or anything that is not plain text)."""
    from pydantic import SecretStr

    values = {**lookup(VARIABLES), **overrides}
    if set(values) <= TEXT_FIELDS and all(
            isinstance(v, str) or (k == "api_key" and isinstance(v, SecretStr))
            for k, v in values.items()):
        if isinstance(values.get("api_key"), str):
            values["api_key"] = SecretStr(values["api_key"])
        return PlainSettings(**values, model_fields_set=frozenset(values))
    from chatstate.adapter.settings import ModelSettings

    return ModelSettings(**overrides)


def read_dotenv(path: Path) -> dict[str, str]:
    """The variables of a .env file (upper-cased names); {} if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"could not read {path.resolve()} ({exc}); fix or remove the file, "
                         "or set the variables in the environment instead") from exc
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        name, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        quote = value[:1]
        if quote in ("'", '"') and value.find(quote, 1) > 0:
            value = value[1:value.find(quote, 1)]  # anything after the closing quote is a comment
            if quote == '"':
                value = value.replace("\\n", "\n")
        else:
            value = value.split(" #", 1)[0].rstrip()
        out[name.strip().upper()] = value
    return out


def lookup(names: Mapping[str, Sequence[str]], dotenv: Path | None = Path(".env"),
           environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """field -> value: the first of its variable names set (non-empty) in the
    environment, else the first set in the .env file (read only if needed)."""
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
    file_vars: dict[str, str] | None = None
    found: dict[str, str] = {}
    for name, variables in names.items():
        value = next((env[v] for v in variables if env.get(v)), None)
        if value is None:
            if file_vars is None:
                file_vars = read_dotenv(dotenv) if dotenv is not None else {}
            value = next((file_vars[v] for v in variables if file_vars.get(v)), None)
        if value is not None:
            found[name] = value
    return found
