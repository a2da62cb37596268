"""The transcript model and its hash chain, by example and by property.

Properties (hypothesis, modest example counts): arbitrary messages (any Unicode
text incl. NUL and control characters, usage dicts, nested params) survive
``model_dump``/``model_validate``, JSON text, and both local stores with every
hash unchanged; any single-field mutation, deletion (of any but the last
message), duplication or swap is caught by ``verify()`` at the exact position.
A cut-off tail cannot be seen by the chain alone: the stores catch it from the
count they record (tests/contract/test_store_badinput.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chatstate.core.canonical import canonical_json
from chatstate.core.transcript import (
    SCHEMA_VERSION,
    Conversation,
    Message,
    check_schema,
    new_id,
    validate_id,
    verify_chain,
)
from chatstate.errors import InvalidConversationId, SchemaVersionError
from chatstate.stores import open_store

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# -- strategies -------------------------------------------------------------------------------

NASTY = list("\x00\x01\x07\x1b\x7f\x85\u2028\u2029\ufeff\u200b\n\r\t\"\\'/{}[],:é中\u0301😀")
texts = st.one_of(st.text(st.characters(codec="utf-8"), max_size=80),
                  st.text(st.sampled_from(NASTY), max_size=30))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8)
usages = st.none() | st.dictionaries(texts, st.integers(-(2**70), 2**70), max_size=4)
params = st.none() | st.dictionaries(texts, json_values, max_size=3)
ROLES = ["system", "user", "assistant", "tool"]


@st.composite
def chains(draw: st.DrawFn, min_size: int = 1, max_size: int = 6) -> list[Message]:
    """A sealed chain of arbitrary messages."""
    out: list[Message] = []
    prev = None
    for _ in range(draw(st.integers(min_size, max_size))):
        prev = Message.seal(
            prev, role=draw(st.sampled_from(ROLES)), content=draw(texts),
            turn_id=draw(texts), status=draw(st.sampled_from(["complete", "partial"])),
            model=draw(st.none() | texts), usage=draw(usages), params=draw(params),
            created_at=draw(st.none() | texts))
        out.append(prev)
    return out


FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "seq": st.integers(0, 10_000), "role": st.sampled_from(ROLES), "content": texts,
    "created_at": texts, "turn_id": texts, "status": st.sampled_from(["complete", "partial"]),
    "model": st.none() | texts, "usage": usages, "params": params,
    "hash": st.text("0123456789abcdef", min_size=64, max_size=64),
}

# -- examples ---------------------------------------------------------------------------------


def test_seal_numbers_and_chains() -> None:
    a = Message.seal(None, role="user", content="hi", turn_id="t-1")
    b = Message.seal(a, role="assistant", content="hello", turn_id="t-1", model="m",
                     usage={"prompt_tokens": 3})
    assert (a.seq, b.seq) == (0, 1)
    assert len(a.hash) == 64
    assert a.hash == a.expected_hash(None)
    assert b.hash == b.expected_hash(a.hash) != b.expected_hash(None)
    assert Conversation(id="c", messages=[a, b]).verify() is None
    assert Conversation(id="c").verify() is None
    assert Conversation(id="c").last_seq == -1


def test_messages_are_frozen_and_strict() -> None:
    m = Message.seal(None, role="user", content="hi", turn_id="t")
    with pytest.raises(ValidationError):
        m.content = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Message.model_validate({**m.model_dump(), "evil": 1})
    with pytest.raises(ValidationError):
        Message.model_validate({**m.model_dump(), "role": "wizard"})
    with pytest.raises(ValidationError):
        Message.model_validate({**m.model_dump(), "seq": -1})


def test_canonical_json_is_sorted_and_compact() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": "é", "c": None}]}) == \
        '{"a":[1,{"c":null,"d":"é"}],"b":1}'


@pytest.mark.parametrize("good", ["a", "A-b_c.d", "0" * 128, ".hidden", "..a", "a..", "-"])
def test_valid_ids(good: str) -> None:
    assert validate_id(good) == good


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "x\0", "0" * 129, "é", "a b",
                                 "a\n", 5, None])
def test_invalid_ids(bad: Any) -> None:
    with pytest.raises(InvalidConversationId) as info:
        validate_id(bad)
    assert isinstance(info.value, ValueError)
    assert "\0" not in str(info.value)
    assert len(str(info.value)) < 300


def test_new_ids_are_valid_and_distinct() -> None:
    ids = {new_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(validate_id(i) for i in ids)


def test_schema_versions() -> None:
    check_schema(SCHEMA_VERSION, "x")
    check_schema(1, "x")
    for bad in (SCHEMA_VERSION + 1, None, "1"):
        with pytest.raises(SchemaVersionError) as info:
            check_schema(bad, "somewhere.json")
        assert "somewhere.json" in str(info.value)


# -- round trips ------------------------------------------------------------------------------


@SETTINGS
@given(chains())
def test_model_round_trip_preserves_hashes(msgs: list[Message]) -> None:
    for m in msgs:
        for again in (Message.model_validate(m.model_dump()),
                      Message.model_validate_json(m.model_dump_json())):
            assert again == m
            assert again.hash == m.hash
            assert again.body() == m.body()
    assert verify_chain(msgs) is None
    conv = Conversation(id="c", messages=msgs)
    assert Conversation.model_validate_json(conv.model_dump_json()).verify() is None


@pytest.fixture(scope="module")
def local_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    base = tmp_path_factory.mktemp("props")
    stores = [open_store(f"json://{base}/store"), open_store(f"sqlite://{base}/s.db")]
    yield stores
    for s in stores:
        s.close()


_ids = itertools.count()


@SETTINGS
@given(msgs=chains(), split=st.integers(0, 6), partial=st.booleans())
def test_store_round_trip_preserves_hashes(local_stores: list[Any], msgs: list[Message],
                                           split: int, partial: bool) -> None:
    tail = None
    if partial and len(msgs) > 1:
        tail = msgs.pop().model_copy(update={"status": "partial"})
        tail = tail.model_copy(update={"hash": tail.expected_hash(msgs[-1].hash)})
    for store in local_stores:
        cid = f"p{next(_ids)}"
        store.create(Conversation(id=cid))
        for batch in (msgs[:split], msgs[split:]):
            store.append(cid, batch)
        if tail is not None:
            store.save_partial(cid, tail)
        conv = store.load(cid)
        assert conv.messages == msgs, store.url
        assert [m.hash for m in conv.messages] == [m.hash for m in msgs]
        assert conv.verify() is None
        assert conv.partial == tail


# -- tampering is found at the right position ----------------------------------------------


@pytest.mark.invariant(6)
@SETTINGS
@given(chains(), st.data())
def test_any_single_field_mutation_is_found_where_it_is(msgs: list[Message],
                                                        data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(msgs) - 1))
    field = data.draw(st.sampled_from(sorted(FIELD_VALUES)))
    value = data.draw(FIELD_VALUES[field])
    original = msgs[i]
    changed = original.model_copy(update={field: value})
    assume(changed.body() != original.body() if field != "hash" else value != original.hash)
    tampered = [*msgs[:i], changed, *msgs[i + 1:]]
    assert Conversation(id="c", messages=tampered).verify() == i


@pytest.mark.invariant(6)
@SETTINGS
@given(chains(min_size=2), st.data())
def test_deletion_is_found_where_it_is(msgs: list[Message], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(msgs) - 2))  # the last one: see the module docstring
    assert verify_chain([*msgs[:i], *msgs[i + 1:]]) == i
    assert verify_chain(msgs[:-1]) is None  # a cut-off tail is invisible to the chain alone


@pytest.mark.invariant(6)
@SETTINGS
@given(chains(min_size=2), st.data())
def test_swap_and_duplicate_are_found_where_they_are(msgs: list[Message],
                                                     data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(msgs) - 2))
    j = data.draw(st.integers(i + 1, len(msgs) - 1))
    swapped = list(msgs)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    assert verify_chain(swapped) == i
    assert verify_chain([*msgs[: i + 1], msgs[i], *msgs[i + 1:]]) == i + 1

