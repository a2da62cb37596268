"""The public face of chatstate: exactly these names, each resolvable, and a cheap import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import chatstate

PUBLIC = [
    "AsyncChat",
    "Batch",
    "Chat",
    "ChatstateError",
    "Completion",
    "ConfigurationError",
    "ConflictError",
    "Conversation",
    "ConversationInUse",
    "ConversationNotFound",
    "CorruptTranscriptError",
    "EphemeralStoreError",
    "Interrupted",
    "InvalidConversationId",
    "LeaseLost",
    "Message",
    "ModelAdapter",
    "ModelError",
    "SchemaVersionError",
    "Store",
    "StoreUnavailable",
    "Tool",
    "ToolLoopError",
    "make_adapter",
    "mcp_tools",
    "open_store",
    "tool",
]

HEAVY = ["openai", "httpx2", "pydantic", "pydantic_settings"]


def test_all_is_pinned_and_sorted() -> None:
    assert chatstate.__all__ == PUBLIC
    assert sorted(PUBLIC) == PUBLIC


def test_every_public_name_resolves() -> None:
    for name in PUBLIC:
        value = getattr(chatstate, name)
        assert value is not None
        assert getattr(value, "__name__", name) == name
    assert set(PUBLIC) <= set(dir(chatstate))


def test_errors_share_one_base() -> None:
    errors = [n for n in PUBLIC if n.endswith("Error") or n in ("ConversationNotFound",
                                                                "InvalidConversationId")]
    for name in errors:
        assert issubclass(getattr(chatstate, name), chatstate.ChatstateError), name


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        getattr(chatstate, "NoSuchThing")  # noqa: B009


def test_import_chatstate_loads_no_heavy_dependency() -> None:
    code = ("import json, sys, chatstate; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_importing_chatstate_imports_no_framework() -> None:
    """The integrations are optional: chatstate and chatstate.integrations import neither
    the Agents SDK nor LangChain (each is imported by its own submodule only)."""
    frameworks = ["agents", "langchain_core", "langchain"]
    code = ("import json, sys, chatstate, chatstate.integrations; "
            f"print(json.dumps([m for m in {frameworks!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == []
