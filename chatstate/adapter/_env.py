"""The adapter's configuration defaults, and reading the environment and a ``.env`` file
without pydantic-settings.

The defaults are written once, in ``PlainSettings``: ``ModelSettings``,
``RetryPolicy`` and the backends take theirs from ``DEFAULTS``.

Only what ModelSettings needs: variable names matched case-insensitively, empty
values treated as unset (``OPENAI_API_KEY=`` in .env.example means "no key"),
and the real environment ranked above the ``.env`` files as a whole (the current
directory's, then the user config directory's), and those above ``config.toml``. The
``.env`` syntax is the common subset: ``KEY=value`` lines, an optional
``export``, single or double quotes, ``#`` comments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatstate.core.config import VARIABLE_NAMES, read_dotenv

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# field -> the variables it is read from, first wins (CHATSTATE_* over OPENAI_*)
VARIABLES = {
    **{k: v for k, v in VARIABLE_NAMES.items() if k != "store"},  # the store is not the adapter's
    **{name: (f"CHATSTATE_{name.upper()}",) for name in (
        "timeout", "connect_timeout", "max_retries", "backoff_base", "backoff_max",
        "retry_after_max")},
}
TEXT_FIELDS = frozenset({"model", "base_url", "api_key", "api"})


class Secret:
    """An API key that never shows in a repr, a str, a log line or a traceback.

    What pydantic's SecretStr did for the settings, without importing pydantic on
    the way to a turn: the key is read with ``get_secret_value()`` only; falsy
    when empty. Inside ModelSettings it validates from a str (or another secret).
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')" if self._value else "Secret('')"

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __len__(self) -> int:
        return len(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def coerce(cls, value: Any) -> Secret:
        if isinstance(value, Secret):
            return value
        if isinstance(value, str):
            return cls(value)
        if callable(getattr(value, "get_secret_value", None)):  # pydantic's SecretStr
            return cls(value.get_secret_value())
        raise ValueError("the API key must be a string")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.coerce, serialization=core_schema.plain_serializer_function_ser_schema(str))


@dataclass(frozen=True)
class PlainSettings:
    """ModelSettings' values when nothing needs validating (text only, defaults else).

    Built without the pydantic model, whose class creation is a measurable part of
    a cold `chatstate ask`; same attribute names. Its defaults are the defaults of
    every setting (``DEFAULTS``)."""

    model: str = DEFAULT_MODEL
    base_url: str = DEFAULT_BASE_URL
    api_key: Secret | None = None  # never the bare key
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
    values = {**lookup(VARIABLES), **overrides}
    if set(values) <= TEXT_FIELDS and all(
            isinstance(v, str) or (k == "api_key" and isinstance(v, Secret))
            for k, v in values.items()):
        if isinstance(values.get("api_key"), str):
            values["api_key"] = Secret(values["api_key"])
        return PlainSettings(**values, model_fields_set=frozenset(values))
    from chatstate.adapter.settings import ModelSettings

    return ModelSettings(**overrides)


_DEFAULT: Any = object()


def lookup(names: Mapping[str, Sequence[str]], dotenv: Path | None = _DEFAULT,
           environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """field -> value: the first of its variable names set (non-empty) in the
    environment, else in the .env files (the current directory's, then the config
    directory's; read only if needed), else the setting of the same name in
    ``config.toml`` (``chatstate.core.config``). An explicit ``dotenv`` path reads
    that one file and no config file."""
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
    file_vars: dict[str, str] | None = None
    config: dict[str, Any] | None = None
    found: dict[str, str] = {}
    for name, variables in names.items():
        value = next((env[v] for v in variables if env.get(v)), None)
        if value is None:
            if file_vars is None:
                file_vars = _dotenv_vars(dotenv)
            value = next((file_vars[v] for v in variables if file_vars.get(v)), None)
        if value is None and dotenv is _DEFAULT:
            if config is None:
                from chatstate.core.config import load

                config = load().as_dict()
            value = config.get(name) if name in TEXT_FIELDS else None
        if value is not None:
            found[name] = value
    return found


def _dotenv_vars(dotenv: Path | None) -> dict[str, str]:
    if dotenv is None:
        return {}
    if dotenv is not _DEFAULT:
        return read_dotenv(dotenv)
    from chatstate.core.config import dotenv_paths

    merged: dict[str, str] = {}
    for path in reversed(dotenv_paths()):  # the first file wins, so it is merged last
        merged.update({k: v for k, v in read_dotenv(path).items() if v})
    return merged
