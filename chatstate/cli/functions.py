"""`--functions FILE.py`: the functions in a Python file become tools, and their calls show.

As in llm: every public function defined in the file (not imported into it) is
a tool; a ``@chatstate.tool`` in it keeps its options (``idempotent=False``).
The file is run as a module of its own, so it can import what it needs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from chatstate.cli.render import neutralise

__all__ = ["functions_option", "load_functions", "tool_printer"]


def functions_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--functions", "functions", metavar="FILE.py", multiple=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Python file whose functions the model may call as tools (repeatable); "
             "@chatstate.tool(idempotent=False) marks one that must never run twice.")(f)


def load_functions(paths: Sequence[Path]) -> list[Any]:
    """The tools defined in ``paths``; a bad file is a usage error naming it."""
    from chatstate.core.tools import Tool

    tools: list[Any] = []
    for path in paths:
        module = _run(path)
        found = [v for k, v in vars(module).items() if not k.startswith("_") and (
            (isinstance(v, Tool) and getattr(v.fn, "__module__", None) == module.__name__)
            or (inspect.isfunction(v) and v.__module__ == module.__name__))]
        if not found:
            raise click.UsageError(f"--functions {path}: defines no functions; write at least "
                                   "one `def name(arg: type) -> str:` in it")
        try:
            tools += [v if isinstance(v, Tool) else Tool(v) for v in found]
        except (TypeError, ValueError) as exc:
            raise click.UsageError(f"--functions {path}: {exc}") from exc
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise click.UsageError(f"--functions: more than one tool is named {', '.join(twice)}; "
                               "rename one")
    return tools


def _run(path: Path) -> Any:
    if not path.is_file():
        raise click.UsageError(f"--functions {path}: no such file")
    name = f"chatstate_functions_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise click.UsageError(f"--functions {path}: not a Python file (use FILE.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so dataclasses and pickling in the file can find it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise click.UsageError(f"--functions {path}: running it failed: "
                               f"{type(exc).__name__}: {exc}") from exc
    return module


def tool_printer(write: Callable[[str], None]) -> Callable[[Any], None]:
    """An ``on_tool`` callback that describes each stored call and result in one line."""
    def show(message: Any) -> None:
        if message.role == "assistant":
            for call in message.tool_calls or ():
                function = call["function"]
                write(f"tool call> {function['name']}({_brief(function['arguments'])})")
        elif message.status == "partial":  # the marker stored before a side effect ran
            write(f"tool started> {message.tool_call_id}")
        else:
            status = "" if message.status == "complete" else f" ({message.status})"
            write(f"tool result{status}> {_brief(message.text)}")
    return show


def _brief(text: str, limit: int = 200) -> str:
    with contextlib.suppress(ValueError):  # compact JSON reads better than the model's spacing
        text = json.dumps(json.loads(text), ensure_ascii=False)
    text = " ".join(text.split())
    return neutralise(text if len(text) <= limit else text[:limit] + "…")
