"""Templates: a system prompt, a model and parameters kept under a name.

One TOML file per template in ``<user config dir>/chatstate/templates/NAME.toml``,
written atomically with mode 0600::

    system = "You are a terse reviewer of {language} code."
    model = "gpt-4o-mini"

    [params]
    temperature = 0.2

``{placeholders}`` (a name in braces) in the system prompt are filled from
``values`` (``-p key value`` on the command line); braces around anything
else (JSON, code) are left alone. A placeholder left unfilled is an error
that names it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatstate.errors import TemplateError  # (defined there; old path kept)

NOT_PARAMS = frozenset({"model", "messages", "stream"})
"""Request fields that are not model parameters: the model is ``--model`` (or a
template's own ``model``), the messages the conversation's, streaming the command's."""
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
ENV_DIR = "CHATSTATE_TEMPLATES_DIR"


@dataclass
class Template:
    name: str
    system: str
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def placeholders(self) -> list[str]:
        return sorted(set(PLACEHOLDER.findall(self.system)))

    def render(self, values: Mapping[str, str]) -> str:
        """The system prompt with ``values`` filled in; every placeholder must have one."""
        missing = [p for p in self.placeholders() if p not in values]
        if missing:
            flags = " ".join(f"-p {p} VALUE" for p in missing)
            raise TemplateError(f"template {self.name!r} needs a value for "
                                f"{', '.join(missing)}: pass {flags}")
        return PLACEHOLDER.sub(lambda m: values[m.group(1)], self.system)

    def to_toml(self) -> str:
        lines = [f"system = {_toml_value(self.system)}"] if self.system else []
        if self.model:
            lines.append(f"model = {_toml_value(self.model)}")
        if self.params:
            lines += ["", "[params]"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in sorted(self.params.items())]
        return "\n".join(lines) + "\n"


def templates_dir() -> Path:
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override).expanduser().absolute()
    from platformdirs import user_config_path

    return user_config_path("chatstate") / "templates"


def _path(name: str) -> Path:
    if not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise TemplateError(f"invalid template name {name!r}: use 1-64 letters, digits, "
                            "'-', '_' or '.'")
    return templates_dir() / f"{name}.toml"


def save(template: Template) -> Path:
    """Write (or replace) a template, durably, 0600 in a 0700 directory."""
    from chatstate.durable.files import atomic_write

    path = _path(template.name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, template.to_toml().encode())
    return path


def load(name: str) -> Template:
    path = _path(name)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TemplateError(f"no template {name!r} in {path.parent}; `chatstate templates "
                            "list` shows the saved ones") from None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TemplateError(f"{path}: not valid TOML ({exc}); fix or remove the file "
                            f"(`chatstate templates rm {name}`)") from exc
    # a template may hold only a model and parameters: no system prompt
    system, model, params = data.get("system", ""), data.get("model"), data.get("params", {})
    unknown = sorted(set(data) - {"system", "model", "params"})
    if (not isinstance(system, str) or not (model is None or isinstance(model, str))
            or not isinstance(params, dict) or unknown):
        raise TemplateError(f"{path}: expected optional `system` and `model` (text) and "
                            f"an optional [params] table{'; unknown keys ' if unknown else ''}"
                            f"{', '.join(unknown)}; fix the file or save it again")
    reserved = sorted(NOT_PARAMS & set(params))
    if reserved:
        raise TemplateError(f"{path}: [params] holds {', '.join(reserved)}, which "
                            "is not a model parameter (set the template's `model` instead, "
                            "or save it again with --model); fix the file")
    return Template(name, system, model, params)


def list_names() -> list[str]:
    folder = templates_dir()
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []


def remove(name: str) -> None:
    path = _path(name)
    try:
        path.unlink()
    except FileNotFoundError:
        raise TemplateError(f"no template {name!r} in {path.parent}") from None


def parse_param(item: str) -> tuple[str, Any]:
    """``k=v`` -> (k, v) with v read as JSON when it is (a number, true, a list), else text."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise TemplateError(f"--param {item!r}: expected key=value, e.g. temperature=0.2")
    if key.strip() in NOT_PARAMS:
        raise TemplateError(f"--param {item!r}: {key.strip()} is not a model parameter: "
                            "use --model for the template's model, and a key such as "
                            "temperature or top_p")
    return key.strip(), parse_value(raw)


def parse_value(raw: str) -> Any:
    """A parameter's value as typed: JSON when it parses (0.2, true, ["END"]), else text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    """TOML for the flat values a template holds (JSON's escapes are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        if isinstance(value, str):  # TOML wants DEL escaped too; \u escapes of scalars only
            return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TemplateError(f"a template parameter cannot hold {type(value).__name__} "
                        f"({value!r}); use text, a number, true/false or a list")
