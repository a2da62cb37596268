"""The fields of a stored message, and the fast structural test of stored messages.

``MESSAGE_FIELDS`` is the one table of a message's fields (name -> type, default):
``chatstate.core.transcript`` keeps messages as plain records over it and
``chatstate.core._models`` builds the pydantic model from it when a value needs one.
``plain_message`` and ``plain_free`` say whether parsed dicts are messages pydantic
would take exactly as they are, so a load makes records without pydantic (False is no
verdict: the pydantic model then decides).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import countOf, itemgetter
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool", "event"]
"""``event`` marks a change to what a framework's session shows (an SDK ``pop_item``, a
``clear_session``): it is recorded in the chain, never sent to a model."""
Status = Literal["complete", "partial", "error", "unknown"]
"""``complete`` and ``partial`` (a cut-off reply) for any message; a ``tool`` result is
``error`` when the tool raised (or the call was invalid) and ``unknown`` when a
non-idempotent tool was interrupted and may or may not have run."""

Content = str | list[dict[str, Any]]

# Added in 0.2: omitted from the hashed body while None, so old hashes stay valid.
OPTIONAL_FIELDS = ("tool_calls", "tool_call_id", "name", "extra", "finish_reason",
                   "requested_model")
# Token counts, with one level of detail ("prompt_tokens_details": {"cached_tokens": 3}).
Usage = dict[str, int | dict[str, int]]


REQUIRED: Any = object()
"""Marks a field without a default in the field tables below."""

MESSAGE_FIELDS: dict[str, tuple[Any, Any]] = {
    "seq": (int, REQUIRED),
    "role": (Role, REQUIRED),
    "content": (Content, REQUIRED),
    "created_at": (str, REQUIRED),
    "turn_id": (str, REQUIRED),
    "status": (Status, "complete"),
    "model": (str | None, None),
    "usage": (Usage | None, None),
    "params": (dict[str, Any] | None, None),
    "tool_calls": (list[dict[str, Any]] | None, None),
    "tool_call_id": (str | None, None),
    "name": (str | None, None),
    "extra": (dict[str, Any] | None, None),
    "finish_reason": (str | None, None),
    "requested_model": (str | None, None),
    "hash": (str, ""),
}
"""The one field table of a stored message: name -> (type, default). ``Message`` keeps
its values as a plain record; the pydantic model built from this table
(``chatstate.core._models``) is made only when a value needs more than the fast
structural check (coercion, or an error to report in pydantic's words).

``tool_calls``: assistant tool calls as chat-completions sends them: ``{"id", "type":
"function", "function": {"name", "arguments"}}``, arguments the raw JSON string, kept
byte for byte. ``tool_call_id``: on a ``tool`` message, the call it answers.
``extra``: other fields the provider returned that a later request needs
(``refusal``, ``reasoning``, ...), kept as they came. ``finish_reason``: why the model
stopped, when it was not a normal stop ("length", "content_filter").
``requested_model``: the model the request named, when the server reported a
different one in ``model``."""

_ROLES = frozenset(("system", "user", "assistant", "tool", "event"))
_STATUSES = frozenset(("complete", "partial", "error", "unknown"))
MESSAGE_NAMES = tuple(MESSAGE_FIELDS)
_MESSAGE_KEYS = frozenset(MESSAGE_FIELDS)
_MESSAGE_REQUIRED = frozenset(k for k, (_, d) in MESSAGE_FIELDS.items() if d is REQUIRED)
MESSAGE_DEFAULTS = {k: d for k, (_, d) in MESSAGE_FIELDS.items() if d is not REQUIRED}
OPTIONAL = frozenset(OPTIONAL_FIELDS)
_NOT_NONE = frozenset(("status", "hash"))


def _str_keys(d: dict[Any, Any]) -> bool:
    return all(type(k) is str for k in d)


def _opt_str(v: Any) -> bool:
    return type(v) is str


def _str_dict(v: Any) -> bool:
    return type(v) is dict and _str_keys(v)


def _usage(v: Any) -> bool:
    if type(v) is not dict:
        return False
    for k, n in v.items():
        if type(k) is not str:
            return False
        if type(n) is not int and (type(n) is not dict or not all(
                type(a) is str and type(b) is int for a, b in n.items())):
            return False
    return True


def _calls(v: Any) -> bool:
    if type(v) is not list:
        return False
    for call in v:
        if type(call) is not dict or not _str_keys(call):
            return False
        function = call.get("function")
        if type(call.get("id")) is not str or type(function) is not dict or \
                type(function.get("name")) is not str or \
                type(function.get("arguments")) is not str:
            return False
    return True


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "status": lambda v: v in _STATUSES, "hash": _opt_str, "model": _opt_str,
    "tool_call_id": _opt_str, "name": _opt_str, "finish_reason": _opt_str,
    "requested_model": _opt_str, "params": _str_dict, "extra": _str_dict,
    "usage": _usage, "tool_calls": _calls}
"""The fast check of each field with a default, for a value other than None (status and
hash have no None: a None there fails its check)."""


def plain_message(d: dict[str, Any]) -> bool:
    """Does ``d`` hold a message pydantic would take exactly as it is (no coercion)?

    False is no verdict: the pydantic model then decides, coercing or raising."""
    keys = d.keys()
    if not (_MESSAGE_REQUIRED <= keys <= _MESSAGE_KEYS):
        return False
    seq = d["seq"]
    if type(seq) is not int or seq < 0 or d["role"] not in _ROLES or \
            type(d["created_at"]) is not str or type(d["turn_id"]) is not str:
        return False
    content = d["content"]
    if type(content) is not str and not _plain_parts(content):
        return False
    for k in keys - _MESSAGE_REQUIRED:
        v = d[k]
        if (v is not None or k in _NOT_NONE) and not _CHECKS[k](v):
            return False
    return True


def _plain_parts(content: Any) -> bool:
    """Is ``content`` (not a string) a list of parts each with a string ``type``?"""
    if type(content) is not list:
        return False
    for part in content:
        if type(part) is not dict or type(part.get("type")) is not str or \
                not _str_keys(part):
            return False
    return True


class _Absent:
    """A field a stored message leaves out (``plain_messages``)."""


_ABSENT = _Absent()
_NONE_OR_ABSENT = frozenset((type(None), _Absent))
_TYPES_OF = {"hash": frozenset((str, _Absent)), **{
    k: frozenset((str, type(None), _Absent)) for k, check in _CHECKS.items()
    if check is _opt_str and k != "hash"}}
"""The types an optional string field may hold (hash has no None)."""


def message_keys(items: list[dict[str, Any]]) -> set[str] | None:
    """Every field some of these stored messages hold, when each holds the required ones
    and no others (None otherwise): one pass over the list."""
    present: set[str] = set()
    for shape in set(map(tuple, items)):
        keys = frozenset(shape)
        if not (_MESSAGE_REQUIRED <= keys <= _MESSAGE_KEYS):
            return None
        present |= keys
    return present


FREE_FIELDS = ("usage", "params", "extra", "tool_calls")
"""The fields besides ``content``'s parts that hold free JSON (where a number can stand)."""


def plain_messages(items: list[Any], present: set[str] | None = None) -> bool:
    """``plain_message`` for every one of ``items`` (dicts freshly parsed), a field at a
    time over the whole list: each test a C loop (``map``, ``set``) rather than a Python
    call per message, so a long transcript costs a few passes over its fields. The same
    verdicts: True only if ``plain_message`` is True for each; False is no verdict (the
    caller then asks item by item)."""
    return plain_free(items) is not None


def plain_free(items: list[Any]) -> list[int] | None:
    """``plain_messages``' verdict, and where free JSON stands: None unless every one of
    ``items`` is a plain message; else the positions of those whose content is a list of
    parts or whose ``FREE_FIELDS`` hold a value (usually none).

    Each test is one C loop over the list. Lists whose messages all hold the same
    fields (what a store writes) take fewer: each field read by ``itemgetter`` (a
    KeyError says the fields differ: then the loops that allow for it), several at once,
    and every optional field that is None in all of them checked in one pass."""
    if not items:
        return []
    try:
        if set(map(type, items)) != {dict}:
            return None
        keys = tuple(items[0])
        if set(map(len, items)) == {len(keys)}:
            try:  # each of keys read from every item below: they all hold exactly these
                return _plain_free(items, set(keys), True)
            except KeyError:
                pass
        present = message_keys(items)
        return None if present is None else _plain_free(items, present, False)
    except TypeError:  # an unhashable role or status: item by item decides (and raises)
        return None


def _plain_free(items: list[dict[str, Any]], present: set[str], one: bool
                ) -> list[int] | None:
    """``plain_free`` of dicts holding the fields ``present`` between them (``one``: each
    holds every one of them, which itemgetter's KeyError then proves)."""
    if not _MESSAGE_REQUIRED <= present <= _MESSAGE_KEYS:
        return None
    n = len(items)
    seqs = list(map(itemgetter("seq"), items))
    if set(map(type, seqs)) != {int} or min(seqs) < 0 or \
            set(map(type, map(itemgetter("created_at"), items))) != {str} or \
            set(map(type, map(itemgetter("turn_id"), items))) != {str}:
        return None
    rest = present - _MESSAGE_REQUIRED
    if one and "status" in rest:
        pairs = set(map(itemgetter("role", "status"), items))
        if not set(map(itemgetter(0), pairs)) <= _ROLES or \
                not set(map(itemgetter(1), pairs)) <= _STATUSES:
            return None
        rest.discard("status")
    elif not set(map(itemgetter("role"), items)) <= _ROLES:
        return None
    contents = list(map(itemgetter("content"), items))
    free = [] if set(map(type, contents)) == {str} else \
        [i for i, c in enumerate(contents) if type(c) is not str]
    if not all(_plain_parts(contents[i]) for i in free):
        return None
    nullable = sorted(rest - _NOT_NONE)
    if one and nullable and countOf(map(itemgetter(*nullable), items), (
            None,) * len(nullable) if len(nullable) > 1 else None) == n:
        rest -= set(nullable)  # all None, the common case: nothing more to check
    for k in rest:
        values = list(map(itemgetter(k), items)) if one else \
            list(map(dict.get, items, repeat(k, n), repeat(_ABSENT, n)))
        if k == "status":
            if not set(values) - {_ABSENT} <= _STATUSES:  # None is no status
                return None
            continue
        types = set(map(type, values))
        if k in _TYPES_OF:
            if not types <= _TYPES_OF[k]:
                return None
        elif not types <= _NONE_OR_ABSENT:  # a dict or list field: each value checked
            check = _CHECKS[k]
            held = [i for i, v in enumerate(values) if v is not None and v is not _ABSENT]
            if not all(check(values[i]) for i in held):
                return None
            if k in FREE_FIELDS:
                free.extend(held)
    return sorted(set(free))

