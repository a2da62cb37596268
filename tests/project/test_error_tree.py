"""The error tree: the docstring of chatstate/errors.py draws exactly the classes there,
every exception class chatstate defines elsewhere is listed as internal, and a caller's
mistake raises a ConfigurationError (still a ValueError), not the bare base class."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

import chatstate.errors as errors
from chatstate.errors import (
    ChatstateError,
    ConfigurationError,
    InvalidInput,
    InvalidOption,
    InvalidStoreURL,
    InvalidTool,
    MissingExtra,
)

PACKAGE = ROOT / "chatstate"
ROW = re.compile(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Za-z_]\w*)\s+(\(also an? (\w+)\))?")
INTERNAL = re.compile(r"^    ([\w.]+)\.(\w+)\s")


def _sections() -> tuple[list[str], list[str]]:
    doc = errors.__doc__ or ""
    tree_part, _, internal_part = doc.partition("Internal control flow")
    tree = [line for line in tree_part.splitlines() if line.startswith("    ")]
    internal = [line for line in internal_part.splitlines() if line.startswith("    ")]
    return tree, internal


def drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """name -> (parent in the drawing, the builtin named by "(also a X)")."""
    tree, _ = _sections()
    out: dict[str, tuple[str | None, str | None]] = {}
    stack: list[str] = []
    for line in tree:
        match = ROW.match(line)
        assert match, f"errors.py docstring: cannot read the tree line {line!r}"
        indent, name, _, also = match.groups()
        depth = len(indent) // 4 + (0 if line[4:].startswith(name) else 1)
        assert depth <= len(stack), f"{name}: drawn deeper than its parent"
        del stack[depth:]
        assert name not in out, f"{name} is drawn twice"
        out[name] = (stack[-1] if stack else None, also)
        stack.append(name)
    return out


def real_tree() -> dict[str, tuple[str | None, str | None]]:
    out: dict[str, tuple[str | None, str | None]] = {}
    for name, value in vars(errors).items():
        if not (isinstance(value, type) and issubclass(value, ChatstateError)):
            continue
        ours = [b for b in value.__bases__ if issubclass(b, ChatstateError)]
        builtin = [b.__name__ for b in value.__bases__
                   if not issubclass(b, ChatstateError) and b is not Exception]
        assert len(ours) <= 1, f"{name}: bases {value.__bases__}"
        assert len(builtin) <= 1, f"{name}: bases {value.__bases__}"
        out[name] = (ours[0].__name__ if ours else None, builtin[0] if builtin else None)
    return out


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn, real = drawn_tree(), real_tree()
    assert sorted(drawn) == sorted(real)
    for name, (parent, also) in real.items():
        assert drawn[name] == (parent, also), name


def test_every_error_class_in_errors_py_is_one_of_ours() -> None:
    """Nothing but the tree is defined there (no stray Exception subclasses)."""
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    defined = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert sorted(defined) == sorted(real_tree())


def _exception_classes() -> dict[str, list[str]]:
    """module -> exception classes it defines, found in the source (nothing imported)."""
    known = {"BaseException", "Exception", "ValueError", "TypeError", "KeyError",
             "RuntimeError", "OSError", "LookupError", "ImportError", *real_tree()}
    classes: list[tuple[str, str, list[str]]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else
                         b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                classes.append((module, node.name, bases))
    found: dict[str, list[str]] = {}
    grew = True
    while grew:  # a subclass of an exception class defined elsewhere in chatstate counts too
        grew = False
        for module, name, bases in classes:
            if name not in found.get(module, []) and known & set(bases):
                found.setdefault(module, []).append(name)
                known.add(name)
                grew = True
    return found


def test_every_exception_class_elsewhere_is_listed_as_internal() -> None:
    _, internal = _sections()
    listed = set()
    for line in internal:
        match = INTERNAL.match(line)
        assert match, f"errors.py docstring: cannot read the internal line {line!r}"
        listed.add(f"chatstate.{match.group(1)}.{match.group(2)}")
    defined = {f"{module}.{name}" for module, names in _exception_classes().items()
               if module != "chatstate.errors" for name in names}
    assert defined == listed, "move an error a caller sees into errors.py, or list it there"


def test_the_old_import_paths_still_work() -> None:
    from chatstate.batch import InputError
    from chatstate.ops.probe import ProbeReportError
    from chatstate.ops.survival import SurvivalError, SurvivalFileMissing
    from chatstate.ops.templates import TemplateError

    assert InputError is errors.BatchInputError
    assert ProbeReportError is errors.ProbeReportError
    assert (SurvivalError, SurvivalFileMissing) == (errors.SurvivalError,
                                                     errors.SurvivalFileMissing)
    assert TemplateError is errors.TemplateError


def test_the_library_docs_name_every_error() -> None:
    text = (ROOT / "docs" / "library.md").read_text()
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in real_tree() if f"`{name}`" not in section]
    assert missing == []


# -- a caller's mistake is a ConfigurationError, and still a ValueError -----------------------

def _mistake(exc: pytest.ExceptionInfo[BaseException], kind: type[ConfigurationError]) -> None:
    assert isinstance(exc.value, kind)
    assert isinstance(exc.value, ValueError)
    assert isinstance(exc.value, ChatstateError)


@pytest.mark.parametrize(("url", "says"), [
    ("nope://x", "unknown store scheme 'nope'"),
    ("chat.db", "a store URL needs a scheme"),
    ("sqlite://relative/chat.db", "needs an absolute path"),
    ("json://relative/dir", "needs an absolute path"),
    ("s3://Not_A_Bucket/prefix", "invalid s3 store URL"),
    ("postgresql://host/db?schema=Bad-Name", "store URL"),
])
def test_a_bad_store_url_is_an_invalid_store_url(url: str, says: str) -> None:
    from chatstate import open_store

    with pytest.raises(InvalidStoreURL, match=re.escape(says)) as exc:
        open_store(url)
    _mistake(exc, InvalidStoreURL)


HIDE = """
import sys
sys.modules[{module!r}] = None  # as if the extra were not installed
from chatstate.errors import MissingExtra
try:
    {action}
except MissingExtra as exc:
    import json
    print(json.dumps([str(exc), exc.extra, isinstance(exc, ValueError)]))
"""


@pytest.mark.parametrize(("module", "action", "extra"), [
    ("obstore", "import chatstate; chatstate.open_store('s3://bucket/prefix')", "s3"),
    ("psycopg", "import chatstate; chatstate.open_store('postgresql://h/db')", "postgres"),
    ("langchain_core", "import chatstate.integrations.langchain", "langchain"),
])
def test_a_missing_extra_names_its_pip_install(module: str, action: str, extra: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", HIDE.format(module=module, action=action)],
                            capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    message, named, is_value_error = json.loads(result.stdout)
    assert f"pip install 'chatstate[{extra}]'" in message
    assert (named, is_value_error) == (extra, True)


def test_a_bad_option_is_an_invalid_option(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    from chatstate.batch import Batch
    from chatstate.ops.usage import collect, parse_since
    from chatstate.session.context import ENV_WINDOW, env_window

    with pytest.raises(InvalidOption, match="usage by 'colour'") as exc:
        collect(None, by="colour")
    _mistake(exc, InvalidOption)
    with pytest.raises(InvalidOption, match="--since 'yesterday'"):
        parse_since("yesterday")
    monkeypatch.setenv(ENV_WINDOW, "lots")
    with pytest.raises(InvalidOption, match=ENV_WINDOW):
        env_window()
    with pytest.raises(InvalidOption, match=re.escape("must contain {text}")):
        Batch(tmp_path / "out", prompt="no placeholder")


def test_bad_input_is_invalid_input(tmp_path: Path) -> None:
    from chatstate.core import content
    from chatstate.ops.transfer import read_import

    (tmp_path / "x.json").write_text('{"not": "messages"}')
    with pytest.raises(InvalidInput, match="cannot import: not a chatstate export") as exc:
        read_import(tmp_path / "x.json")
    _mistake(exc, InvalidInput)
    with pytest.raises(InvalidInput, match="not a base64 data URL"):
        content.parse_data_url("http://example.com/cat.png")


def test_a_bad_tool_is_an_invalid_tool_and_keeps_its_old_type() -> None:
    from chatstate import Tool
    from chatstate.core.tools import toolset

    with pytest.raises(InvalidTool, match="a tool must be a function") as exc:
        Tool(42)  # type: ignore[arg-type]
    assert isinstance(exc.value, TypeError)  # as it always was
    _mistake(exc, InvalidTool)

    def look(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="two tools are named 'look'") as dup:
        toolset([look, Tool(look)])
    _mistake(dup, InvalidTool)


def test_the_base_class_is_never_raised_bare_outside_the_drill() -> None:
    """Each raise says which kind of failure it is; the drill's harness keeps the base."""
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "raise ChatstateError(" in line:
                bare.append(f"{path.relative_to(ROOT)}:{number}")
    assert all(b.startswith("chatstate/drill/server.py:") for b in bare), bare


def test_missing_extra_keeps_a_plain_message() -> None:
    exc = MissingExtra("needs x: pip install 'chatstate[s3]'", extra="s3")
    assert str(exc) == "needs x: pip install 'chatstate[s3]'"
    assert exc.extra == "s3"
