"""Tools a model may call: ``@chatstate.tool`` and the JSON schema it derives.

    @chatstate.tool                      # schema from type hints + docstring
    def get_weather(city: str) -> str:
        "The weather in a city."

    @chatstate.tool(idempotent=False)    # side effects: never run twice
    def send_email(to: str, body: str) -> str: ...

A ``Tool`` keeps the function callable as before. ``idempotent`` is what
recovery asks: after a crash mid-call, an idempotent tool is run again, a
non-idempotent one is not (its call is answered "outcome unknown"). Plain
functions passed as tools are wrapped as idempotent tools.

The schema comes from the signature via pydantic: each parameter's type hint
and default; the docstring's first paragraph is the description, and lines
``name: text`` under an ``Args:`` section describe the parameters.

Two seams serve tool sources beyond Python functions (MCP servers): a tool may
return a ``ToolOutput`` (content parts, and whether the result is an error), and
``Tool.approval(call)`` may gate a call before it starts; the loop stores the
``Approval`` it gives on the call's messages (``params["approval"]``).
"""

from __future__ import annotations

import contextvars
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, overload

from chatstate.errors import InvalidTool

__all__ = ["Approval", "Tool", "ToolOutput", "current_call_id", "tool", "toolset"]

_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("chatstate_call_id",
                                                                     default=None)


def current_call_id() -> str | None:
    """The id of the tool call being run, inside a tool; None elsewhere."""
    return _CALL_ID.get()


@dataclass(frozen=True)
class ToolOutput:
    """A tool's result beyond a string: content parts (text, image, file) and its status.

    ``error`` stores the result as a tool error (status ``error``); the model sees it.
    """

    content: str | list[dict[str, Any]]
    error: bool = False


@dataclass(frozen=True)
class Approval:
    """Whether a call may run, and why: ``how`` is stored with the call's result."""

    granted: bool
    how: str


def unique_call_ids(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``calls`` with every id non-empty and unique (a model's repeated or empty id is
    replaced by a new one): each call's result is found by its id, so two calls of one
    id had one result taken for both, and a crash left the other one unanswered."""
    if not calls:
        return calls
    import secrets

    seen: set[str] = set()
    out = []
    for call in calls:
        cid = call.get("id") if isinstance(call, dict) else None
        if isinstance(call, dict) and (not isinstance(cid, str) or not cid or cid in seen):
            cid = f"call_{secrets.token_hex(12)}"
            call = {**call, "id": cid}
        if isinstance(cid, str):
            seen.add(cid)
        out.append(call)
    return out


class Tool:
    """A function the model may call, with its name, description and parameter schema."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None,
                 description: str | None = None, idempotent: bool = True) -> None:
        if not callable(fn):
            raise InvalidTool(f"a tool must be a function, not {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
                type(fn).__call__):
            raise InvalidTool(f"tool {name or getattr(fn, '__name__', fn)!r} is an async "
                              "function: the tool loop calls tools in a thread, so its "
                              "coroutine would never run; give a plain function (it may "
                              "call asyncio.run itself)")
        self.fn = fn
        self.name = name or fn.__name__
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.name):
            raise InvalidTool(f"tool name {self.name!r} is not valid for the API: use 1-64 "
                              "letters, digits, '_' or '-'")
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else _summary(doc)
        self.idempotent = idempotent
        self._args = _args_model(fn, _arg_docs(doc))
        self.parameters = _schema(self._args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, idempotent={self.idempotent})"

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function, validated and converted by the schema.

        Raises ValueError saying which argument is wrong.
        """
        from pydantic import ValidationError

        try:
            parsed = self._args.model_validate(args)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "arguments"
            raise ValueError(f"{where}: {first['msg']}") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    def approval(self, call: dict[str, Any]) -> Approval | None:
        """Asked before ``call`` starts: None runs it without asking (a Python tool you
        passed in), an ``Approval`` is stored with its result, and a refused call is
        answered "not run" without running."""
        return None

    def spec(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry for this tool."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None,
         idempotent: bool = True) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None,
         idempotent: bool = True) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool: ``@tool`` or ``@tool(idempotent=False, name=...)``."""
    if fn is not None:
        return Tool(fn, name=name, description=description, idempotent=idempotent)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, idempotent=idempotent)

    return wrap


def toolset(tools: Iterable[Tool | Callable[..., Any]] | None) -> dict[str, Tool]:
    """Tools by name; plain functions become idempotent tools. Two of one name are an error."""
    out: dict[str, Tool] = {}
    for item in tools or ():
        t = item if isinstance(item, Tool) else Tool(item)
        if t.name in out:
            raise InvalidTool(f"two tools are named {t.name!r}: tool names must be unique")
        out[t.name] = t
    return out


def _summary(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())


def _arg_docs(doc: str) -> dict[str, str]:
    """``name: text`` lines of an ``Args:`` (or ``Parameters:``) docstring section."""
    found: dict[str, str] = {}
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    for line in (section.group(1).splitlines() if section else ()):
        match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def _args_model(fn: Callable[..., Any], docs: dict[str, str]) -> Any:
    """A pydantic model of ``fn``'s parameters (unknown arguments are refused)."""
    from pydantic import ConfigDict, Field, create_model

    hints = _hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidTool(f"tool {fn.__name__}: *args/**kwargs cannot be described to a "
                              "model; name each parameter")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints.get(param.name, Any),
                              Field(default, description=docs.get(param.name)))
    return create_model(f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields)


def _schema(model: Any) -> dict[str, Any]:
    """The JSON schema the model is shown, without pydantic's titles."""
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    return schema


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(fn)
    except Exception:  # an unresolvable forward reference: describe those as "any"
        return {}
