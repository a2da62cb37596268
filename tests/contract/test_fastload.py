"""The fast load path hashes what Message.body() hashes, for old and rich messages.

The json store verifies the chain over orjson's canonical rewrite of each parsed
line; wherever that could differ from ``Message.body()`` (a float orjson spells
otherwise, a lone surrogate) the exact path decides, so both accept and refuse
exactly the same chains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.stores import sealed_as_is

from chatstate.core.fields import (
    FREE_FIELDS,
    MESSAGE_FIELDS,
    plain_free,
    plain_message,
    plain_messages,
)
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import CorruptTranscriptError
from chatstate.stores import open_store
from chatstate.stores._fastload import (
    canonical,
    chain_intact,
    first_break,
    parse_canonical,
    parse_canonicals,
    stored_messages,
)
from chatstate.stores.json._doc import message_line

RICH: list[dict[str, Any]] = [
    {"role": "user", "content": "plain 0.1 text"},
    {"role": "assistant", "content": "cut", "status": "partial", "model": "m"},
    {"role": "assistant", "content": "done", "model": "m",
     "usage": {"prompt_tokens": 3, "completion_tokens": 5},
     "params": {"temperature": 0.7, "top_p": 1.0, "stop": ["\n"], "seed": 2**40}},
    {"role": "user", "content": "ünïcödé, emoji 🦊, CJK 漢字, RTL \u202e, LS \u2028, "
     "controls \x00\x01\x1f\x7f, quotes \" and \\ backslash, tab\tnewline\n"},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": "data:,x"}},
                                 {"type": "future_kind", "x": [1, 2.5, None, True]}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": "{\"a\": 1.50, \"b\": \"é\"}"}}]},
    {"role": "tool", "content": "42", "tool_call_id": "call_1", "name": "f"},
    {"role": "assistant", "content": "r", "extra": {"refusal": None, "reasoning": "ok",
                                                    "nested": {"z": 1, "a": [0.1, -0.0]}}},
]


def chain(specs: list[dict[str, Any]]) -> list[Message]:
    """Sealed as given, a lone surrogate too (``Message.seal`` would replace it): what a
    store written by another tool, or before seal made text well formed, can hold."""
    out: list[Message] = []
    for i, spec in enumerate(specs):
        out.append(sealed_as_is(out[-1] if out else None, turn_id=f"t{i}", **spec))
    return out


def test_canonical_bytes_of_a_stored_line_are_what_body_hashes() -> None:
    for msg in chain(RICH):
        item = json.loads(message_line(msg))  # as the json store keeps it
        assert canonical(item) == msg.body().encode("utf-8"), msg


def test_the_whole_chain_verifies_on_the_fast_path_and_a_change_is_found() -> None:
    msgs = chain(RICH)
    items = [json.loads(message_line(m)) for m in msgs]
    assert first_break(msgs, [canonical(i) for i in items]) is None
    edited = [*msgs[:3], msgs[3].model_copy(update={"content": "edited"}), *msgs[4:]]
    assert first_break(edited, [canonical(json.loads(message_line(m))) for m in edited]) == 3


@pytest.mark.parametrize("spec", [
    {"role": "user", "content": "x", "params": {"big": 1e16, "tiny": 1e-7}},
    {"role": "user", "content": "lone surrogate \ud800 here"},
], ids=["float-spelling", "lone-surrogate"])
def test_where_orjson_differs_the_exact_path_decides(spec: dict[str, Any]) -> None:
    msgs = chain([RICH[0], spec, RICH[2]])
    bodies = [canonical(json.loads(message_line(m))) for m in msgs]
    assert bodies[1] != msgs[1].body().encode("utf-8", "surrogatepass")  # really differs
    assert first_break(msgs, bodies) is None
    forged = msgs[1].model_copy(update={"hash": "0" * 64})
    assert first_break([msgs[0], forged, msgs[2]], bodies) == 1


@pytest.mark.invariant(6)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_stores_load_rich_chains_and_refuse_a_tampered_one(tmp_path: Path, kind: str) -> None:
    url = f"json://{tmp_path}/j" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    specs = [*RICH, {"role": "user", "content": "x", "params": {"big": 1e+16}}]
    msgs = chain(specs * 3)
    store = open_store(url)
    store.create(Conversation(id="c"))
    store.append("c", msgs)
    store.close()
    loaded = open_store(url).load("c").messages
    assert loaded == msgs
    assert [m.body() for m in loaded] == [m.body() for m in msgs]
    if kind == "json":
        path = tmp_path / "j" / "c.json"
        path.write_bytes(path.read_bytes().replace(b"plain 0.1 text", b"plain 0.1 TEXT", 1))
        with pytest.raises(CorruptTranscriptError, match=r"broken at seq 0"):
            open_store(url).load("c")


_FIELD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(
        ["user", "assistant", "tool", "complete", "partial", "error", "nope", ""]),
    st.lists(st.dictionaries(st.sampled_from(["type", "text", "blob"]),
                             st.one_of(st.text(max_size=3), st.integers(0, 2)), max_size=3),
             max_size=2),
    st.dictionaries(st.sampled_from(["a", "prompt_tokens", "function", "id"]),
                    st.one_of(st.integers(0, 9), st.text(max_size=3),
                              st.dictionaries(st.sampled_from(["name", "arguments", "n"]),
                                              st.one_of(st.text(max_size=2),
                                                        st.integers(0, 3)), max_size=2)),
                    max_size=3),
    st.lists(st.dictionaries(st.sampled_from(["id", "function", "type"]),
                             st.one_of(st.text(max_size=2), st.fixed_dictionaries(
                                 {"name": st.text(max_size=2),
                                  "arguments": st.text(max_size=2)})), max_size=3),
             max_size=2))


@st.composite
def _stored_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A message as a store keeps it, some fields perhaps left out, changed or added."""
    base = next(iter(chain([draw(st.sampled_from(RICH))]))).stored()
    for key in draw(st.lists(st.sampled_from([*MESSAGE_FIELDS, "stray"]), max_size=3)):
        if draw(st.booleans()):
            base.pop(key, None)
        else:
            base[key] = draw(_FIELD_VALUES)
    return base


def _each_plain(items: list[Any]) -> bool | None:
    try:
        return all(plain_message(item) for item in items)
    except TypeError:  # an unhashable role or status: no verdict either way
        return None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_stored_dicts(), max_size=6),
                 st.builds(lambda d, n: [dict(d) for _ in range(n)], _stored_dicts(),
                           st.integers(1, 3))))  # all holding the same fields, as stored
def test_the_whole_list_check_gives_each_message_check_verdict(items: list[Any]) -> None:
    """``plain_messages`` (a field at a time over the whole list) says True exactly when
    ``plain_message`` says True for every one, and the records it makes are the ones
    ``Message.from_stored`` makes."""
    each = _each_plain(items)
    assert plain_messages(items) is bool(each)
    if each:  # and where free JSON stands, for the bodies to encode again
        assert plain_free(items) == [i for i, d in enumerate(items) if type(
            d["content"]) is not str or any(d.get(k) is not None for k in FREE_FIELDS)]
    made = Message.from_stored_list(items)
    if each:
        assert made is not None
        assert made == [Message.from_stored(item) for item in items]
    else:
        assert made is None


def test_stored_bodies_parse_as_each_one_would() -> None:
    """``stored_messages`` over canonical bodies: the same records as ``parse_canonical``
    and ``from_stored`` one by one, and the same refusals (a number past 64 bits)."""
    msgs = chain(RICH * 2)
    rows = [(m.body().encode(), m.hash) for m in msgs]
    assert stored_messages(rows) == msgs
    assert [parse_canonical(raw) for raw, _ in rows] == parse_canonicals([r for r, _ in rows])
    big = chain([{"role": "user", "content": "x", "params": {"n": 2**70}}])[0]
    with pytest.raises(ValueError, match="reads back"):
        stored_messages([*rows, (big.body().encode(), big.hash)])
    assert chain_intact([r for r, _ in rows], [m.hash for m in msgs])
    assert not chain_intact([r for r, _ in rows][::-1], [m.hash for m in msgs])


@pytest.mark.parametrize("kind", ["json", "sqlite"])
@pytest.mark.parametrize("logged", [False, True], ids=["document", "log-record"])
def test_an_integer_past_64_bits_loads_exactly(tmp_path: Path, kind: str,
                                              logged: bool) -> None:
    """orjson reads an integer past 64 bits as a float, whose body hashes otherwise: the
    load must read it exactly (in the document and in a log record), not call the chain
    broken."""
    url = f"json://{tmp_path}/j" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    msgs = chain([RICH[0], {"role": "user", "content": "n", "params": {"n": 2**70}},
                  {"role": "assistant", "content": "r", "extra": {"m": -(2**65), "f": 1e16}}])
    store = open_store(url)
    store.create(Conversation(id="c"))
    store.append("c", msgs[:1] if logged else msgs)
    if logged:
        store.append("c", msgs[1:])  # a log record after the document (json)
        again = open_store(url)  # before the first store compacts it at close
        assert again.load("c").messages == msgs
    store.close()
    loaded = open_store(url).load("c").messages
    assert loaded == msgs
    assert loaded[1].params == {"n": 2**70} and type(loaded[1].params["n"]) is int


LONG = 1300  # past the load's first chunks of rows (decode_rows: 512 at a time)
LATE_DAMAGE = {
    "tampered": ("UPDATE messages SET body=replace(body, 'msg 1100\"', 'msg 1100, edited\"') "
                 "WHERE seq=1100", 1100),
    "removed-middle": ("DELETE FROM messages WHERE seq=900", 900),
    "bad-json": ("UPDATE messages SET body='{not json' WHERE seq=700", 700),
}


def _refused_as_it_is(url: str, db_path: Path, damage: str) -> CorruptTranscriptError:
    """Apply the SQL ``damage`` to the database, load conversation ``c``: the load's
    error, once the message rows are shown to be as they were."""
    import sqlite3

    con = sqlite3.connect(db_path)
    con.execute(damage)
    con.commit()
    before = con.execute("SELECT * FROM messages ORDER BY seq").fetchall()
    con.close()
    store = open_store(url)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c")
    store.close()
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT * FROM messages ORDER BY seq").fetchall() == before
    con.close()
    return info.value


def _long_sqlite(tmp_path: Path, extra: dict[int, dict[str, Any]] | None = None
                 ) -> tuple[str, list[Message]]:
    url = f"sqlite://{tmp_path}/s.db"
    msgs = chain([(extra or {}).get(i, {"role": "user" if i % 2 else "assistant",
                                        "content": f"msg {i}"}) for i in range(LONG)])
    store = open_store(url)
    store.create(Conversation(id="c"))
    store.append("c", msgs)
    store.close()
    return url, msgs


@pytest.mark.invariant(6)
@pytest.mark.parametrize("damage", LATE_DAMAGE.values(), ids=LATE_DAMAGE.keys())
def test_damage_past_the_first_chunks_is_named_by_its_seq(tmp_path: Path,
                                                          damage: tuple[str, int]) -> None:
    """The chunks before the damage were verified and let go: the row-by-row path takes
    over from the damaged chunk, and names the very row; the rows stay as they were."""

    url, _ = _long_sqlite(tmp_path)
    sql, position = damage
    error = _refused_as_it_is(url, tmp_path / "s.db", sql)
    assert error.position == position
    assert f"seq {position}" in str(error)


def test_a_late_body_the_fast_path_refuses_loads_exactly(tmp_path: Path) -> None:
    """An integer past 64 bits at seq 800: the chunks before it load by the fast path,
    the rest row by row, and the whole chain is the one stored."""
    url, msgs = _long_sqlite(tmp_path, {800: {"role": "user", "content": "n",
                                              "params": {"n": 2**70}}})
    store = open_store(url)
    loaded = store.load("c").messages
    store.close()
    assert loaded == msgs
    assert loaded[800].params == {"n": 2**70}


@pytest.mark.invariant(6)
@pytest.mark.parametrize(("gone", "position"), [("seq=0", 0), ("seq=1", 1), ("1", 0)],
                         ids=["first", "second", "every"])
def test_a_missing_long_body_is_named_by_its_seq(tmp_path: Path, gone: str,
                                                 position: int) -> None:
    """A long message's body lives in long_bodies (m009): with its row gone the load
    names the message (it raised AttributeError before), and changes nothing."""
    import sqlite3

    from chatstate.core.canonical import LARGE_CONTENT

    url = f"sqlite://{tmp_path}/s.db"
    msgs = chain([{"role": "user", "content": "x" * LARGE_CONTENT},
                  {"role": "assistant", "content": "y" * LARGE_CONTENT}])
    store = open_store(url)
    store.create(Conversation(id="c"))
    store.append("c", msgs)
    store.close()
    con = sqlite3.connect(tmp_path / "s.db")
    assert con.execute("SELECT count(*) FROM long_bodies").fetchone() == (2,)
    con.close()
    error = _refused_as_it_is(url, tmp_path / "s.db", f"DELETE FROM long_bodies WHERE {gone}")
    assert error.position == position
    assert "'c'" in str(error)
