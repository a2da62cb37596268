"""The pydantic models of the transcript's records, built on first need only.

``chatstate.core.transcript`` keeps messages and conversations as plain records
checked by a fast structural test; a value that test does not pass (one to
coerce, or one to refuse) goes through the pydantic model built here from the
same field tables, so what is accepted, how it is coerced and the words of a
ValidationError are pydantic's, as before. Building these models takes tens of
milliseconds, which a cold ``chatstate ask`` no longer pays.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from chatstate.core import fields
from chatstate.core import transcript as t
from chatstate.core.fields import REQUIRED


def _fields(table: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (kind, default) in table.items():
        if default is REQUIRED:
            out[name] = (kind, Field(ge=0) if name == "seq" else ...)
        elif default is t._NOW:
            out[name] = (kind, Field(default_factory=t.now_iso))
        elif isinstance(default, type):
            out[name] = (kind, Field(default_factory=default))
        else:
            out[name] = (kind, default)
    return out


class _MessageChecks(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("content", check_fields=False)
    @classmethod
    def _parts_are_typed(cls, value: fields.Content) -> fields.Content:
        if isinstance(value, list):
            for i, part in enumerate(value):
                if not isinstance(part.get("type"), str):
                    raise ValueError(f"content part {i} has no string 'type'")
        return value

    @field_validator("tool_calls", check_fields=False)
    @classmethod
    def _calls_have_ids(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, call in enumerate(value or ()):
            function = call.get("function")
            if not isinstance(call.get("id"), str) or not isinstance(function, dict) or \
                    not isinstance(function.get("name"), str) or \
                    not isinstance(function.get("arguments"), str):
                raise ValueError(f"tool call {i} needs a string 'id' and a 'function' with "
                                 "string 'name' and 'arguments'")
        return value


@cache
def model(name: str) -> type[BaseModel]:
    """The pydantic model of the record class ``name`` (Message, Conversation,
    ConversationSummary), named as it is so errors read as before."""
    if name == "Message":
        return create_model("Message", __base__=_MessageChecks,
                            __module__=t.__name__, **_fields(fields.MESSAGE_FIELDS))
    if name == "Conversation":
        return create_model("Conversation", __config__=ConfigDict(extra="forbid"),
                            __module__=t.__name__, **_fields(t.CONVERSATION_FIELDS))
    if name == "ConversationSummary":
        return create_model("ConversationSummary", __module__=t.__name__,
                            **_fields(t.SUMMARY_FIELDS))
    raise KeyError(name)
