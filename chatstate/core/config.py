"""The user's config file: ``config.toml`` in the user config directory.

    model = "gpt-4o-mini"            # the default model
    base_url = "http://127.0.0.1:8080/v1"
    store = "sqlite:///home/me/chats.db"
    context_window = 32768

    [options]                        # model parameters every turn sends (-o overrides)
    temperature = 0.2

    [aliases]                        # --model fast means --model gpt-4o-mini
    fast = "gpt-4o-mini"

It is the lowest source of a setting: flags > environment > ``.env`` (the current
directory's, then the config directory's) > ``config.toml``. The directory is
``CHATSTATE_CONFIG_DIR`` if set, else the platform's user config directory
(``$XDG_CONFIG_HOME/chatstate``, ``~/.config/chatstate`` on Linux). It holds no key:
an API key belongs in the environment or a ``.env`` file (``.env`` in the config
directory works from any directory).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatstate.errors import ConfigurationError

__all__ = ["ENV_DIR", "Config", "config_dir", "config_path", "dotenv_paths", "dotenv_value",
           "load", "read_dotenv", "store_url"]

ENV_DIR = "CHATSTATE_CONFIG_DIR"
FILE_NAME = "config.toml"
TEXT_KEYS = ("model", "base_url", "store")
TABLE_KEYS = ("options", "aliases")
KNOWN = (*TEXT_KEYS, "context_window", *TABLE_KEYS)
VARIABLE_NAMES: dict[str, tuple[str, ...]] = {
    "model": ("CHATSTATE_MODEL",),
    "base_url": ("CHATSTATE_BASE_URL", "OPENAI_BASE_URL"),
    "api_key": ("CHATSTATE_API_KEY", "OPENAI_API_KEY"),
    "store": ("CHATSTATE_STORE",),
    "api": ("CHATSTATE_API",),
}
"""setting -> the variables it is read from, first wins (the adapter's are these too)."""
_AT_LINE = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


@dataclass(frozen=True)
class Config:
    """What ``config.toml`` sets (all optional); ``path`` is where it was read from."""

    path: Path
    exists: bool = False
    model: str | None = None
    base_url: str | None = None
    store: str | None = None
    context_window: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def resolve_model(self, name: str | None) -> str | None:
        """``name`` through the aliases (one step: an alias names a model, not an alias)."""
        if name is None:
            return None
        return self.aliases.get(name, name)

    def as_dict(self) -> dict[str, Any]:
        """The settings that are set, for ``chatstate config show``."""
        out: dict[str, Any] = {k: getattr(self, k) for k in (*TEXT_KEYS, "context_window")
                               if getattr(self, k) is not None}
        out.update({k: dict(getattr(self, k)) for k in TABLE_KEYS if getattr(self, k)})
        return out


def config_dir() -> Path:
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override).expanduser().absolute()
    from platformdirs import user_config_path

    return user_config_path("chatstate")


def config_path() -> Path:
    return config_dir() / FILE_NAME


def dotenv_paths() -> list[Path]:
    """The ``.env`` files read, first wins: the current directory's, the config directory's."""
    here = Path(".env")
    there = config_dir() / ".env"
    try:
        same = here.resolve() == there.resolve()
    except OSError:
        same = False
    return [here] if same else [here, there]


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


def dotenv_value(*variables: str) -> str | None:
    """The first of ``variables`` set in the environment, else in the .env files."""
    for v in variables:
        if os.environ.get(v):
            return os.environ[v]
    for path in dotenv_paths():
        found = read_dotenv(path)
        for v in variables:
            if found.get(v):
                return found[v]
    return None


def sources() -> dict[str, tuple[str | None, str]]:
    """setting -> (value, where it came from) for model, base_url, api_key and store,
    below the command line: the environment, a .env file, config.toml, or "default"
    (value None). The API key's value is for the caller to hide, never to show."""
    config = load().as_dict()
    files = [(path, read_dotenv(path)) for path in dotenv_paths()]
    out: dict[str, tuple[str | None, str]] = {}
    for name, variables in VARIABLE_NAMES.items():
        found: tuple[str | None, str] = (None, "default")
        env = next((v for v in variables if os.environ.get(v)), None)
        if env is not None:
            found = (os.environ[env], f"environment {env}")
        else:
            hit = next(((path, v, vals[v]) for path, vals in files for v in variables
                        if vals.get(v)), None)
            if hit is not None:
                found = (hit[2], f"{hit[0].absolute()} {hit[1]}")
            elif name in config:
                found = (str(config[name]), str(load().path))
        out[name] = found
    return out


def store_url() -> str | None:
    """The store URL configured outside the command line: CHATSTATE_STORE in the
    environment or a .env file, else ``store`` in config.toml; None for the default."""
    return dotenv_value("CHATSTATE_STORE") or load().store


_cache: dict[tuple[Path, float, int], Config] = {}


def load(path: Path | None = None) -> Config:
    """The config file at ``path`` (default ``config_path()``); an empty Config if absent.

    A file that cannot be read or parsed, or that sets an unknown key or a value of the
    wrong type, raises ConfigurationError naming the file, the line when known, and the fix.
    """
    path = path or config_path()
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return Config(path=path)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path} ({exc.strerror}); fix its permissions "
                                 f"or point {ENV_DIR} elsewhere") from exc
    key = (path, st.st_mtime, st.st_size)
    if key not in _cache:
        _cache.clear()
        _cache[key] = _parse(path)
    return _cache[key]


def _parse(path: Path) -> Config:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{path} is not UTF-8 text (byte {exc.start}); save it as "
                                 "UTF-8") from exc
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path} ({exc.strerror}); fix its permissions "
                                 f"or point {ENV_DIR} elsewhere") from exc
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _AT_LINE.search(message)
        where = f" line {match.group(1)}" if match else ""
        problem = _AT_LINE.sub("", message)
        raise ConfigurationError(
            f"{path}{where} is not valid TOML ({problem}); fix that line (settings look like "
            'model = "gpt-4o-mini", strings in quotes, [options] and [aliases] as tables)'
        ) from None
    return _build(path, data)


def _build(path: Path, data: dict[str, Any]) -> Config:
    unknown = sorted(set(data) - set(KNOWN))
    if unknown:
        hint = (" (an API key goes in the environment or a .env file, not here)"
                if any("key" in k.lower() for k in unknown) else "")
        raise ConfigurationError(f"{path}: unknown setting {', '.join(map(repr, unknown))}"
                                 f"{hint}; the settings are {', '.join(KNOWN)}")
    values: dict[str, Any] = {}
    for key in TEXT_KEYS:
        if key in data:
            if not isinstance(data[key], str) or not data[key].strip():
                raise ConfigurationError(f'{path}: {key} must be a non-empty string, e.g. '
                                         f'{key} = "..."')
            values[key] = data[key].strip()
    if "context_window" in data:
        window = data["context_window"]
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigurationError(f"{path}: context_window must be a whole number of "
                                     "tokens, e.g. context_window = 32768")
        values["context_window"] = window
    for key in TABLE_KEYS:
        if key in data:
            if not isinstance(data[key], dict):
                raise ConfigurationError(f"{path}: {key} must be a table: a [{key}] line, "
                                         "then one KEY = VALUE line each")
            values[key] = dict(data[key])
    options = values.get("options", {})
    for key in options:
        if key in ("model", "messages", "stream"):
            raise ConfigurationError(f"{path}: [options] {key} is not a model parameter: set "
                                     "model at the top of the file")
    for name, target in values.get("aliases", {}).items():
        if not isinstance(target, str) or not target.strip():
            raise ConfigurationError(f'{path}: [aliases] {name} must name a model, e.g. '
                                     f'{name} = "gpt-4o-mini"')
    return Config(path=path, exists=True, **values)
