"""One implementation holds the cyclic collector off: ``chatstate._gcpause``.

The CLI's start-up and the stores' loads both pause the collector; each turns it on
again only if it found it on, so a load inside the start-up leaves it off for the CLI.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from support import ROOT

from chatstate import _gcpause


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_only_the_pause_module_turns_the_collector_off() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{n}"
                 for path in sorted((ROOT / "chatstate").rglob("*.py"))
                 if path.name != "_gcpause.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if "gc.disable(" in line or "gc.enable(" in line]
    assert offenders == []


@pytest.mark.usefixtures("collector_on")
def test_a_release_turns_the_collector_on_once_and_only_if_it_was_on() -> None:
    release = _gcpause.hold()
    assert not gc.isenabled()
    with _gcpause.paused():  # a load inside the start-up
        assert not gc.isenabled()
    assert not gc.isenabled()  # still the start-up's to release
    release()
    assert gc.isenabled()
    gc.disable()
    release()  # a second call does nothing
    assert not gc.isenabled()
    gc.enable()
    _gcpause.NOT_HELD()
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_the_block_turns_it_on_again_after_an_error() -> None:
    with pytest.raises(RuntimeError), _gcpause.paused():
        assert not gc.isenabled()
        raise RuntimeError("in the load")
    assert gc.isenabled()
