"""The layers hold: who may import what.

- code outside ``chatstate.stores`` uses the stores' public helpers, never their
  private modules (``stores._files``, ``stores._s3doc``, ...);
- code outside ``chatstate.adapter`` uses its public names (``chatstate.adapter``,
  ``adapter.dialects.chat_completions``, ...), never its private modules or names;
- the production CLI does not import ``chatstate.testing``: ``ask`` against a real
  OpenAI-compatible endpoint (the fake server, reached over HTTP like any other)
  runs without it;
- one turn writer: outside the stores and the ops that copy stored state as it is,
  only ``chatstate.session.turn_writer`` writes a conversation (``append``,
  ``save_partial``, ``clear_partial``, ``set_header`` on a store).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT
from support.cli_helpers import API_KEY, cli_env

from chatstate.testing import FakeModel

PACKAGE = ROOT / "chatstate"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level] if node.level else []
            if node.level and path.name != "__init__.py":
                base = parts[:len(parts) - node.level]
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


# The layers of docs/extending.md, lowest first. A package imports only packages of a
# lower rank: never one beside it (stores and the adapter know nothing of each other;
# batch, serve and the integrations are separate front ends), never one above it.
LAYERS = [
    ["errors", "_moved", "_version", "_gcpause"],
    ["durable"],
    ["core"],
    ["stores", "adapter", "tools_mcp"],
    ["ops"],
    ["session"],
    ["web"],  # below serve, which mounts it at /ui
    ["integrations", "batch", "serve", "testing"],
    ["drill"],
    ["cli"],
    ["__init__", "__main__"],
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _layer(module: str) -> str | None:
    """The layer of a ``chatstate.X...`` module name (None for a name outside chatstate)."""
    parts = module.split(".")
    if parts[0] != "chatstate":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _upward_imports() -> list[str]:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        here = rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or \
            rel.name != "__init__.py" else "__init__"
        for line, name in _imports(path):
            there = _layer(name)
            if there is None or there == here:
                continue
            if there not in RANK:  # ``from chatstate import X``: the name X is the layer
                there = name.split(".")[1]
            if there not in RANK or RANK[there] >= RANK[here]:
                offenders.append(f"chatstate/{rel}:{line} ({here}) imports {name} ({there})")
    return offenders


def test_every_package_is_in_a_layer() -> None:
    packages = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
                if p.name != "py.typed" and not p.name.startswith(".")
                and p.name != "__pycache__"}
    assert packages == set(RANK)


def test_imports_point_down_the_layers_only() -> None:
    assert _upward_imports() == []


def test_nothing_outside_the_stores_imports_their_private_modules() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "stores"):
            continue
        for line, name in _imports(path):
            if name.startswith("chatstate.stores._"):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name}")
    assert offenders == []


@pytest.mark.usefixtures("no_model_settings_from_env")
def test_ask_against_a_real_endpoint_never_imports_the_testing_package(tmp_path: Path) -> None:
    with FakeModel(reply_words=3) as fake:
        env = cli_env(tmp_path, CHATSTATE_API_KEY=API_KEY)
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "chatstate", "--store",
             f"sqlite://{tmp_path}/s.db", "ask", "--base-url", fake.base_url, "--model",
             "fake-model", "hello there"], capture_output=True, text=True, env=env,
            timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "hello there" in proc.stdout
        assert len(fake.request_log) == 1  # the reply came over HTTP from the endpoint
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "chatstate.cli" in imported  # -X importtime did report the imports
    assert [m for m in imported if m.startswith("chatstate.testing")] == []


def test_nothing_outside_the_adapter_imports_its_private_modules() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "adapter"):
            continue
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[:2] == ["chatstate", "adapter"] and any(
                    p.startswith("_") for p in parts[2:]):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name}")
    assert offenders == []


# The ops that copy stored state as it is (unfenced, by design) may write a store directly.
# So may the shipped store contract suite, which tests a store's own writes.
COPIES_AS_IT_IS = {"chatstate/ops/migrate.py", "chatstate/ops/transfer.py",
                   "chatstate/ops/fork.py"}
CONTRACT_SUITE = "chatstate/testing/store_contract/"
TURN_WRITER = "chatstate/session/turn_writer.py"


def _names(node: ast.expr) -> Iterator[str]:
    """Every name and attribute in an expression such as ``self.store`` or ``dst``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def _store_writes(path: Path, methods: set[str]) -> Iterator[tuple[int, str]]:
    """(line, method) of each call of a store's write ``methods`` in ``path``.

    A store call is one on a receiver named like a store (``store``, ``self.store``,
    ``self._store``, ``dst``/``src`` in the copying ops), so the turn writer's own
    methods (``writer.save_partial``) are not counted; ``append`` counts with two or
    more arguments (a list's append takes one).
    """
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        if name not in methods:
            continue
        if name == "append" and len(node.args) + len(node.keywords) < 2:
            continue
        if any("store" in n.lower() or n in ("dst", "src") for n in _names(node.func.value)):
            yield node.lineno, name


def _writers(methods: set[str]) -> dict[str, list[str]]:
    """module -> its store write calls, outside ``chatstate/stores`` and the copying ops."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if path.is_relative_to(PACKAGE / "stores") or rel in COPIES_AS_IT_IS or \
                rel.startswith(CONTRACT_SUITE):
            continue
        calls = [f"{line} {name}" for line, name in _store_writes(path, methods)]
        if calls:
            found[rel] = calls
    return found


def test_exactly_one_module_saves_or_clears_a_partial_reply() -> None:
    found = _writers({"save_partial", "clear_partial"})
    assert list(found) == [TURN_WRITER], found


def test_only_the_turn_writer_appends_or_sets_a_header() -> None:
    found = _writers({"append", "set_header"})
    assert set(found) <= {TURN_WRITER}, found
    assert TURN_WRITER in found  # the check does see the writer's own calls


def test_the_store_write_check_sees_a_direct_call(tmp_path: Path) -> None:
    """The checker itself: it finds a front end calling a store, not a list's append or
    the turn writer's methods."""
    sample = tmp_path / "front.py"
    sample.write_text("def f(chat, writer, out, msgs):\n"
                      "    out.append(1)\n"
                      "    writer.save_partial('t', 'text', None)\n"
                      "    chat.store.append(chat.id, msgs)\n"
                      "    chat.store.set_header(chat.id, title='x')\n"
                      "    self._store.save_partial(cid, msgs[0])\n")
    assert list(_store_writes(sample, {"append", "set_header", "save_partial"})) == [
        (4, "append"), (5, "set_header"), (6, "save_partial")]
