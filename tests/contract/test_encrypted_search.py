"""Search on an encrypted store (issue 25, point 2): off unless opted in to a keyed index
(CHATSTATE_ENCRYPTED_SEARCH=keyed); with it, whole-word search works through the CLI,
and the store's bytes hold no word of what was written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli_helpers import invoke
from support.sealed import KEY, OTHER_KEY, keyless, open_raw

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store
from chatstate.stores._keyed_index import INDEX_ID, SETTING
from chatstate.stores.codec import parse_key
from chatstate.testing.store_contract import seal_chain

WORDS = ["Quokka", "zephyrine", "marmalade7", "oxbridge"]


def _url(tmp_path: Path, kind: str) -> str:
    return f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"


def _fill(url: str) -> None:
    with keyless():
        store = open_store(url, key=parse_key(KEY, "test"))
        store.create(Conversation(id="a", title="first"))
        first = Message.seal(None, role="user", content=f"the {WORDS[0]} ate {WORDS[1]}",
                             turn_id="t0")
        second = Message.seal(first, role="assistant", content=f"{WORDS[2]} only",
                              turn_id="t0")
        store.append("a", [first, second])
        store.create(Conversation(id="b", title="second"))
        store.append("b", seal_chain(3, prefix=f"{WORDS[0].upper()} and {WORDS[3]}"))
        store.close()


def _search(url: str, query: str, **env: str) -> tuple[int, list[str], str]:
    done = invoke(["search", query], store=url,
                  env={"CHATSTATE_ENCRYPTION_KEY": KEY, **env})
    return done.code, sorted(line.split(":")[0] for line in done.out.splitlines()), done.err


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_keyed_search_finds_whole_words_and_stores_none_of_them(tmp_path: Path,
                                                                kind: str) -> None:
    url = _url(tmp_path, kind)
    _fill(url)
    opt = {SETTING: "keyed"}
    assert _search(url, "quokka", **opt)[:2] == (0, ["a#0", "b#0", "b#1", "b#2"])
    assert _search(url, "QUOKKA zephyrine", **opt)[:2] == (0, ["a#0"])  # every word, any case
    assert _search(url, "marmalade7", **opt)[:2] == (0, ["a#1"])
    assert _search(url, "marmal", **opt)[1] == []  # whole words only
    assert _search(url, "oxbridge zephyrine", **opt)[1] == []
    # a message appended after the index was built is found on the next search
    with keyless():
        store = open_store(url, key=parse_key(KEY, "test"))
        last = store.load("a").messages[-1]
        store.append("a", [Message.seal(last, role="user", content="late oxbridge",
                                        turn_id="t1")])
        assert [s.id for s in store.list_conversations()] == ["a", "b"]  # the index hidden
        store.close()
    assert _search(url, "oxbridge", **opt)[1] == ["a#2", "b#0", "b#1", "b#2"]
    # the index is in the store, and no word of what was written is
    raw = open_raw(url)
    try:
        index = raw.load(INDEX_ID)
        tokens = [t for m in index.messages for t in m.content[0]["postings"]]
        assert tokens and all(re.fullmatch(r"[0-9a-f]{32}", t) for t in tokens)
    finally:
        raw.close()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes().lower()
            for word in [*WORDS, "late"]:
                assert word.lower().encode() not in data, f"{word!r} is stored in {path}"


def test_without_the_opt_in_search_is_refused_naming_the_setting(tmp_path: Path) -> None:
    url = _url(tmp_path, "sqlite")
    _fill(url)
    code, hits, err = _search(url, "quokka")
    assert code != 0 and hits == []
    assert SETTING + "=keyed" in err and "encrypted" in err, err
    code, _, err = _search(url, "quokka", **{SETTING: "yes"})
    assert code != 0 and "'keyed'" in err, err
    raw = open_raw(url)
    try:
        assert INDEX_ID not in [s.id for s in raw.list_conversations()]  # nothing was built
    finally:
        raw.close()


def test_the_index_is_rebuilt_under_the_new_key_after_rekey(tmp_path: Path) -> None:
    url = _url(tmp_path, "json")
    _fill(url)
    assert _search(url, "zephyrine", **{SETTING: "keyed"})[:2] == (0, ["a#0"])
    done = invoke(["rekey", "--new-key-env", "REKEY_NEW"], store=url,
                  env={"CHATSTATE_ENCRYPTION_KEY": KEY, "REKEY_NEW": OTHER_KEY})
    assert done.code == 0, done.err
    after = invoke(["search", "zephyrine"], store=url,
                   env={"CHATSTATE_ENCRYPTION_KEY": OTHER_KEY, SETTING: "keyed"})
    assert after.code == 0 and after.out.startswith("a#0:"), after.out + after.err
    raw = open_raw(url)
    try:
        from chatstate.stores.codec import fingerprint_of

        index = raw.load(INDEX_ID)
        assert index.metadata["key"] == fingerprint_of(parse_key(OTHER_KEY, "t"))
    finally:
        raw.close()
