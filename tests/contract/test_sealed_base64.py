"""The base64 of sealed records (``chatstate.stores._b64``): pybase64's codec where it is
installed, the standard library's where not. Both must make the same bytes and refuse
the same input, so a store sealed with one loads with the other."""

from __future__ import annotations

import binascii
import os
from pathlib import Path

import pytest
from support.sealed import KEY

from chatstate.core.transcript import Conversation
from chatstate.stores import _b64, open_store
from chatstate.testing.store_contract import seal_chain

CODECS = {"installed": (_b64.encode, _b64.encode_text, _b64.decode),
          "standard": _b64.standard()}


def test_the_installed_codec_is_pybase64s() -> None:
    pytest.importorskip("pybase64", reason="the crypto extra brings pybase64")
    assert _b64.encode.__module__.startswith("pybase64")


@pytest.mark.parametrize("name", list(CODECS))
def test_both_codecs_agree_with_the_standard_alphabet(name: str) -> None:
    encode, encode_text, decode = CODECS[name]
    for size in [*range(0, 70), 750, 4096, 100_003]:
        data = os.urandom(size)
        want = binascii.b2a_base64(data, newline=False)
        assert encode(data) == want
        assert encode_text(data) == want.decode()
        assert decode(want) == data and decode(want.decode()) == data


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("bad", [b"YW!j", b"YWJ", b"YWJj\n", b"YW=j", b"Y WJj", "YWJj\u00e9"])
def test_both_codecs_refuse_what_is_not_strict_base64(name: str, bad: bytes | str) -> None:
    with pytest.raises(ValueError):  # binascii.Error is one
        CODECS[name][2](bad)


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_store_sealed_with_one_codec_loads_with_the_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setenv("CHATSTATE_ENCRYPTION_KEY", KEY)
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    msgs = seal_chain(40, prefix="codec")
    for name, (writer, reader) in {"one": ("installed", "standard"),
                                   "two": ("standard", "installed")}.items():
        for attr, fn in zip(("encode", "encode_text", "decode"), CODECS[writer], strict=True):
            monkeypatch.setattr(_b64, attr, fn)
        store = open_store(url)
        store.create(Conversation(id=name, title=f"title {name}"))
        store.append(name, msgs[:20])
        store.append(name, msgs[20:])
        store.close()
        for attr, fn in zip(("encode", "encode_text", "decode"), CODECS[reader], strict=True):
            monkeypatch.setattr(_b64, attr, fn)
        loaded = open_store(url).load(name)
        assert loaded.messages == msgs and loaded.title == f"title {name}"
