"""Module paths of 0.2 that moved in the layered layout, kept importable for one release.

``import chatstate.content`` gives the very module ``chatstate.core.content`` (not a
copy of its names), so monkeypatching and ``isinstance`` behave as before. Nothing
inside chatstate imports these paths; ``tests/contract/test_layers.py`` checks it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader
    from types import ModuleType

MOVED = {
    "chatstate.content": "chatstate.core.content",
    "chatstate.transcript": "chatstate.core.transcript",
    "chatstate.tools": "chatstate.core.tools",
    "chatstate.redact": "chatstate.core.redact",
    "chatstate.events": "chatstate.core.events",
    "chatstate.durability": "chatstate.durable.guard",
    "chatstate.templates": "chatstate.ops.templates",
    "chatstate.fork": "chatstate.ops.fork",
    "chatstate.usage": "chatstate.ops.usage",
    "chatstate.blobgc": "chatstate.ops.blobgc",
    "chatstate.transfer": "chatstate.ops.transfer",
    "chatstate.migrate": "chatstate.ops.migrate",
    "chatstate.toolloop": "chatstate.session.tool_loop",
    "chatstate.asyncchat": "chatstate.session.asyncchat",
    "chatstate.stores.fsutil": "chatstate.durable.files",
    "chatstate.stores.sqlite_setup": "chatstate.durable.sqlite_setup",
    "chatstate.stores.jsonfile": "chatstate.stores.json.store",
    "chatstate.stores.s3client": "chatstate.stores.s3.client",
    "chatstate.adapter.wire": "chatstate.adapter.backends.wire",
    "chatstate.adapter.sdk": "chatstate.adapter.backends.sdk",
}


class _Alias:
    """A meta path finder and its loader (duck-typed: importlib.abc costs 15 ms to import,
    a third of ``chatstate --help``)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the target module ran already


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
