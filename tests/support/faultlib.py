"""Helpers shared by the fault suite: populating a store, and the checks every fault ends with.

``after_fault`` is the one verdict every tier applies once the fault is over, in a
process other than the writer's: a fresh ``open_store`` (which is recovery)
leaves no temp file, the previous transcript still loads and verifies, every
acknowledged message is there exactly once, and re-appending the writer's own
sealed messages (an error means "outcome unknown") lands each of them once.
It returns the problems instead of asserting, so the power-loss tier can prove
that a broken store *is* caught.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ChatstateError
from chatstate.stores import open_store
from support.stores import local_path, scheme, seal_chain, temp_files
from support.tiers import need

TESTS_DIR = Path(__file__).resolve().parent
WRITER = TESTS_DIR / "fault_writer.py"
PYTHON = sys.executable
CID = "faulty"


def populate(url: str, cid: str = CID, n: int = 6) -> list[Message]:
    """Create ``cid`` holding ``n`` sealed messages; return them."""
    store = open_store(url)
    try:
        store.create(Conversation(id=cid, title="fault test"))
        msgs = seal_chain(n)
        store.append(cid, msgs)
        return msgs
    finally:
        store.close()


@dataclass
class Verdict:
    """What a fresh open found after a fault."""

    problems: list[str] = field(default_factory=list)
    landed_unacked: int = 0
    """Sealed messages stored although never acknowledged: the fault hit after they landed."""


def after_fault(url: str, cid: str, prev: Sequence[Message], acked: Sequence[Sequence[Any]],
                sealed: Sequence[Message] = (), *, retry: bool = True) -> Verdict:
    """What is wrong with the store after a fault. See the module docstring."""
    verdict = Verdict()
    try:
        store = open_store(url)
    except ChatstateError as exc:
        verdict.problems.append(f"a fresh open failed: {exc}")
        return verdict
    try:
        if scheme(url) == "json" and (left := temp_files(local_path(url))):
            verdict.problems.append(f"temp files left after recovery: {left}")
        conv = store.load(cid)
        verdict.problems += chain_problems(conv.messages, prev, acked)
        acked_hashes = {h for _, h in acked}
        stored = {m.hash for m in conv.messages}
        verdict.landed_unacked = sum(1 for m in sealed
                                     if m.hash in stored and m.hash not in acked_hashes)
        if retry and sealed:
            verdict.problems += _retry(store, cid, prev, sealed, acked)
    except ChatstateError as exc:
        verdict.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        store.close()
    return verdict


def _retry(store: Any, cid: str, prev: Sequence[Message], sealed: Sequence[Message],
           acked: Sequence[Sequence[Any]]) -> list[str]:
    """Append the writer's sealed messages again: each must end up stored exactly once."""
    store.append(cid, list(sealed))
    expected = [*prev, *sealed]
    again = store.load(cid)
    problems = chain_problems(again.messages, expected, acked)
    if len(again.messages) != len(expected):
        problems.append(f"the retried append left {len(again.messages)} messages, "
                        f"expected {len(expected)}")
    if again.partial is not None:
        problems.append("a partial reply survived the complete reply")
    return problems


def chain_problems(messages: Sequence[Message], prefix: Sequence[Message],
                   acked: Sequence[Sequence[Any]]) -> list[str]:
    """The chain verifies, starts with ``prefix``, and holds every acked (seq, hash) once."""
    problems = []
    conv = Conversation(id="check", messages=list(messages))
    if (bad := conv.verify()) is not None:
        problems.append(f"hash chain broken at seq {bad}")
    if list(messages[:len(prefix)]) != list(prefix):
        problems.append(f"the previous transcript changed (had {len(prefix)}, "
                        f"now {len(messages)} messages)")
    hashes = [m.hash for m in messages]
    for seq, digest in acked:
        if hashes.count(digest) != 1 or seq >= len(messages) or hashes[seq] != digest:
            state = "missing" if digest not in hashes else "misplaced or duplicated"
            problems.append(f"acknowledged seq {seq} is {state}")
    return problems


def assert_clear_error(text: str, path: str | Path) -> None:
    """One ``error:`` paragraph naming ``path``, and no traceback."""
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, f"expected one error paragraph:\n{text}"
    assert str(path) in errors[0], f"the error does not name {path}:\n{text}"


def require_tool(*names: str, tier: str = "fault") -> None:
    """Skip (or fail, under CHATSTATE_REQUIRE_TIERS), saying which, when a tool is missing."""
    missing = [n for n in names if shutil.which(n) is None]
    need(tier, not missing, f"{', '.join(missing)} not installed "
         "(scripts/test-prereqs installs them)")


def run(*args: str | Path, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, check=False, **kw)


def turn_problems(messages: Sequence[Message]) -> list[str]:
    """Every assistant message directly follows its own user message (or its own partials)."""
    problems = []
    for i, msg in enumerate(messages):
        if msg.role != "assistant":
            continue
        j = i - 1
        while j >= 0 and messages[j].role == "assistant" and messages[j].status == "partial" \
                and messages[j].turn_id == msg.turn_id:
            j -= 1
        if j < 0 or messages[j].role != "user" or messages[j].turn_id != msg.turn_id:
            problems.append(f"seq {msg.seq} ({msg.status} reply of {msg.turn_id}) does not "
                            "follow its own user message")
    return problems
