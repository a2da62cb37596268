"""A store written outside chatstate joins the shipped contract suite, and the registry.

Proves: a small store in a temporary module, registered with
``chatstate.stores.register``, passes ``chatstate.testing.store_contract`` run by
pytest in a subprocess (only pytest and chatstate, no tests/conftest.py), its crash
cases SIGKILLing child writers that open it again from its URL; broken variants of it
(an append without the compare, a partial save that ignores the fence) fail it, and
the run names the failing cases; memory:// passes the whole suite the same way, and is
refused without the explicit allowance; one name in one process is one store. The
registry imports nothing for a string registration, a missing extra says what to
install, and pyproject's entry points name what the registry holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from support import ROOT
from support.cli_helpers import invoke

from chatstate.core.transcript import Conversation
from chatstate.errors import ChatstateError, EphemeralStoreError
from chatstate.stores import open_store, register, store_class

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DIRSTORE = '''
"""A third party's store: one JSON document per conversation in a directory."""
from __future__ import annotations

import json

from chatstate.core.transcript import (Conversation, ConversationSummary, Message, now_iso,
                                       validate_id, verify_chain)
from chatstate.durable.files import atomic_write, ensure_dir, locked, read_bytes, remove_durably
from chatstate.errors import ConflictError, ConversationNotFound, CorruptTranscriptError, LeaseLost
from chatstate.stores.leases import LeaseMethods, holder_of, lease_record
from chatstate.stores.base import (CheckReport, Location, check_append, check_partial_commit,
                                   local_path)


class DirStore(LeaseMethods):
    def __init__(self, root, url):
        self.root, self.url, self.recovery = root, url, []

    @classmethod
    def from_url(cls, url):
        return cls(local_path(url, "dirs:///abs/dir"), url)

    def location(self):
        return Location(url=self.url, path=str(self.root))

    def open(self):
        ensure_dir(self.root)

    def close(self):
        pass

    def _path(self, cid, suffix):
        return self.root / f"c-{validate_id(cid)}.{suffix}"

    def _lock(self, cid):  # every write of a conversation, and its lease, under one flock
        return locked(self._path(cid, "lock"))

    def _read(self, cid):
        raw = read_bytes(self._path(cid, "json"))
        if raw is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        doc = json.loads(raw)
        messages = [Message.model_validate(m) for m in doc["messages"]]
        bad = verify_chain(messages)
        if bad is not None:
            where = str(self._path(cid, "json"))
            raise CorruptTranscriptError(f"{where}: seq {bad} does not chain", where=where,
                                         position=bad)
        partial = Message.model_validate(doc["partial"]) if doc["partial"] else None
        return doc, messages, partial

    def _write(self, cid, doc):
        atomic_write(self._path(cid, "json"), json.dumps(doc).encode())

    def _fence(self, cid, fence):
        raw = read_bytes(self._path(cid, "lease"))
        owner = json.loads(raw)["owner"] if raw else None
        if fence is not None and owner not in (None, fence):
            raise LeaseLost(f"{self.url}: {cid!r} was taken over by another writer", fence=fence)

    def create(self, conversation):
        with self._lock(conversation.id):
            if self._path(conversation.id, "json").exists():
                raise ConflictError(f"conversation {conversation.id!r} already exists")
            self._write(conversation.id, {"header": conversation.header(), "messages": [],
                                          "partial": None})

    def load(self, conversation_id):
        doc, messages, partial = self._read(conversation_id)
        return Conversation(**doc["header"], messages=messages, partial=partial)

    def list_conversations(self, limit=None):
        out = []
        for path in self.root.glob("c-*.json"):
            doc = json.loads(path.read_bytes())
            out.append(ConversationSummary(message_count=len(doc["messages"]), **{
                k: doc["header"][k] for k in ("id", "title", "created_at", "updated_at")}))
        return sorted(out, key=lambda s: s.updated_at, reverse=True)[:limit]

    def delete(self, conversation_id):
        with self._lock(conversation_id):
            if not remove_durably(self._path(conversation_id, "json")):
                raise ConversationNotFound(f"no conversation {conversation_id!r}")

    def append(self, conversation_id, messages, *, fence=None):
        with self._lock(conversation_id):
            doc, stored, partial = self._read(conversation_id)
            self._fence(conversation_id, fence)
            where = str(self._path(conversation_id, "json"))
            already = check_append(where, stored[-1].seq if stored else -1,
                                   lambda seq: stored[seq].hash, messages)
            fresh = list(messages[already:])
            check_partial_commit(where, fresh, partial)
            self._commit(conversation_id, doc, fresh, messages)

    def _commit(self, cid, doc, fresh, messages):
        doc["messages"] += [m.stored() for m in fresh]
        if doc["partial"] and messages and doc["partial"]["seq"] <= messages[-1].seq:
            doc["partial"] = None
        if fresh:
            doc["header"]["updated_at"] = now_iso()
        self._write(cid, doc)

    def save_partial(self, conversation_id, partial, *, fence=None):
        with self._lock(conversation_id):
            doc, stored, _ = self._read(conversation_id)
            self._fence(conversation_id, fence)
            expected = stored[-1].seq + 1 if stored else 0
            if partial.seq != expected:
                raise ConflictError(f"partial for seq {partial.seq}, the next is {expected}",
                                    expected_seq=partial.seq - 1, actual_seq=expected - 1)
            doc["partial"] = partial.stored()
            self._write(conversation_id, doc)

    def clear_partial(self, conversation_id, *, fence=None):
        with self._lock(conversation_id):
            raw = read_bytes(self._path(conversation_id, "json"))
            self._fence(conversation_id, fence)
            if raw:
                self._write(conversation_id, dict(json.loads(raw), partial=None))

    def set_header(self, conversation_id, *, title=None, metadata=None, fence=None):
        with self._lock(conversation_id):
            doc, _, _ = self._read(conversation_id)
            self._fence(conversation_id, fence)
            doc["header"].update({"updated_at": now_iso()},
                                 **({} if title is None else {"title": title}),
                                 **({} if metadata is None else {"metadata": metadata}))
            self._write(conversation_id, doc)

    def _try_lease(self, lease):
        with self._lock(lease.conversation_id):
            raw = read_bytes(self._path(lease.conversation_id, "lease"))
            holder = holder_of(json.loads(raw) if raw else None, lease)
            if holder is None:
                atomic_write(self._path(lease.conversation_id, "lease"),
                             json.dumps(lease_record(lease)).encode())
            return holder

    def _drop_lease(self, lease):
        with self._lock(lease.conversation_id):
            raw = read_bytes(self._path(lease.conversation_id, "lease"))
            if raw and json.loads(raw)["owner"] == lease.owner:
                remove_durably(self._path(lease.conversation_id, "lease"))

    def record_open(self, record):
        with locked(self.root / "opens.lock"):
            raw = read_bytes(self.root / "opens.json") or b"[]"
            atomic_write(self.root / "opens.json", json.dumps([*json.loads(raw), record]).encode())

    def opens(self):
        return json.loads(read_bytes(self.root / "opens.json") or b"[]")

    def check(self):
        probe = self.root / "probe"
        atomic_write(probe, b"probe")
        ok = read_bytes(probe) == b"probe"
        remove_durably(probe)
        return CheckReport(ok=ok, url=self.url, steps=["wrote a probe", "read it", "removed it"])


class AppendWithoutCompare(DirStore):
    """Broken on purpose: appends what it is given, wherever the chain is."""

    def append(self, conversation_id, messages, *, fence=None):
        with self._lock(conversation_id):
            doc, _, _ = self._read(conversation_id)
            self._commit(conversation_id, doc, list(messages), messages)


class PartialIgnoresFence(DirStore):
    """Broken on purpose: a partial save drops the fence it was given."""

    def save_partial(self, conversation_id, partial, *, fence=None):
        super().save_partial(conversation_id, partial)
'''

SUITE = '''
import json
import secrets
from pathlib import Path

import pytest

from chatstate.stores import register
from chatstate.stores.memory.store import MemoryStore
from chatstate.testing.store_contract import StoreContract

register("dirs", "dirstore:DirStore")
register("dirs-nocompare", "dirstore:AppendWithoutCompare")
register("dirs-unfenced", "dirstore:PartialIgnoresFence")


class DirCases(StoreContract):
    scheme = "dirs"

    @pytest.fixture
    def store_url(self, tmp_path):
        return f"{self.scheme}://{tmp_path}/store"

    def damage(self, store_url, conversation_id, seq):
        path = Path(store_url.split("://", 1)[1]) / f"c-{conversation_id}.json"
        doc = json.loads(path.read_text())
        doc["messages"][seq]["content"] += ", edited"
        path.write_text(json.dumps(doc))


class TestDirStore(DirCases):
    pass


class TestAppendWithoutCompare(DirCases):
    scheme = "dirs-nocompare"


class TestPartialIgnoresFence(DirCases):
    scheme = "dirs-unfenced"


class TestMemory(StoreContract):
    allow_ephemeral = True
    in_process = True

    @pytest.fixture
    def store_url(self):
        return "memory://" + secrets.token_hex(8)

    def damage(self, store_url, conversation_id, seq):
        held = MemoryStore.from_url(store_url).space.conversations[conversation_id]
        messages = list(held.messages)
        messages[seq] = messages[seq].model_copy(update={"content": f"msg {seq}, edited"})
        held.messages = tuple(messages)

    def damage_blob(self, store_url, sha256, how):
        blobs = MemoryStore.from_url(store_url).space.blobs
        data, at = blobs[sha256]
        blobs[sha256] = (data[:1000] if how == "truncated" else b"X" + data[1:], at)
'''

@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """The shipped suite on the third party's store, its broken variants and memory://,
    run once by pytest in a subprocess: class -> case -> outcome."""
    root = tmp_path_factory.mktemp("third-party")
    (root / "plugin").mkdir()
    (root / "plugin" / "dirstore.py").write_text(DIRSTORE)
    (root / "suite").mkdir()
    (root / "suite" / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: no conftest
    (root / "suite" / "test_dirstore.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CHATSTATE_"))}
    env["PYTHONPATH"] = str(root / "plugin")
    report = root / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist",
         "-p", "no:cacheprovider", f"--basetemp={root / 'tmp'}", f"--junitxml={report}",
         "test_dirstore.py"],
        cwd=root / "suite", env=env, capture_output=True, text=True, timeout=900, check=False)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    outcomes: dict[str, dict[str, str]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        outcomes.setdefault(cls, {})[case.get("name", "")] = kinds[0] if kinds else "passed"
    assert done.returncode == 1, done.stdout[-3000:]  # the broken variants fail
    return outcomes


def failing(outcomes: dict[str, str]) -> list[str]:
    return sorted(case for case, outcome in outcomes.items() if outcome in ("failure", "error"))


def test_a_third_party_store_passes_the_shipped_suite(suite_run: dict[str, dict[str, str]]
                                                      ) -> None:
    cases = suite_run["TestDirStore"]
    assert failing(cases) == []
    skipped = sorted(case for case, outcome in cases.items() if outcome == "skipped")
    assert len(skipped) == 7  # the blob cases: this store has no blob area
    assert all(case.startswith(("test_a", "test_large", "test_one_image")) for case in skipped)
    for ran in ("test_a_killed_writer_loses_nothing_acknowledged",  # SIGKILLed children
                "test_two_writers_racing_lose_nothing",
                "test_a_fenced_write_after_a_takeover_is_refused[save_partial]",
                "test_writes_onto_a_chain_that_does_not_verify_are_refused"):
        assert cases[ran] == "passed", ran
    assert len(cases) >= 50


def test_an_append_without_the_compare_fails_the_suite(suite_run: dict[str, dict[str, str]]
                                                       ) -> None:
    failed = failing(suite_run["TestAppendWithoutCompare"])
    for case in ("test_stale_expected_seq_conflicts_and_writes_nothing",
                 "test_message_chained_off_stale_last_hash_conflicts",
                 "test_retried_append_never_duplicates", "test_two_writers_racing_lose_nothing"):
        assert case in failed, failed


def test_a_partial_save_that_ignores_the_fence_fails_the_suite(
        suite_run: dict[str, dict[str, str]]) -> None:
    assert failing(suite_run["TestPartialIgnoresFence"]) == [
        "test_a_fenced_write_after_a_takeover_is_refused[save_partial]"]


def test_memory_passes_the_whole_suite(suite_run: dict[str, dict[str, str]]) -> None:
    cases = suite_run["TestMemory"]
    assert set(cases.values()) == {"passed"}, cases
    assert set(cases) == set(suite_run["TestDirStore"])


# -- memory:// ---------------------------------------------------------------------------


def test_memory_is_refused_without_the_explicit_allowance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EphemeralStoreError) as info:
        open_store("memory://refused")
    said = str(info.value)
    assert "refusing store memory://refused" in said
    assert "in this process's memory" in said
    assert "--allow-ephemeral, allow_ephemeral=True or CHATSTATE_ALLOW_EPHEMERAL=1" in said
    assert open_store("memory://refused", allow_ephemeral=True).guard_report.verdict == \
        "ephemeral"
    monkeypatch.setenv("CHATSTATE_ALLOW_EPHEMERAL", "1")
    open_store("memory://refused").close()


def test_the_cli_refuses_memory_unless_allowed() -> None:
    refused = invoke(["list"], store="memory://cli")
    assert refused.code != 0
    assert "refusing store memory://cli" in refused.err
    allowed = invoke(["--allow-ephemeral", "list"], store="memory://cli")
    assert allowed.code == 0, allowed.err


def test_one_name_in_one_process_is_one_store() -> None:
    first = open_store("memory://shared", allow_ephemeral=True)
    first.create(Conversation(id="c1", title="here"))
    second = open_store("memory://shared", allow_ephemeral=True)
    assert second.load("c1").title == "here"
    other = open_store("memory://another", allow_ephemeral=True)
    assert other.list_conversations() == []
    loaded = second.load("c1")
    loaded.metadata["edited"] = True  # a loaded copy is the caller's
    assert first.load("c1").metadata == {}


@pytest.mark.parametrize("url", ["memory://", "memory://a/b", "memory://sp ace"])
def test_a_memory_url_needs_a_plain_name(url: str) -> None:
    with pytest.raises(ChatstateError, match="name the memory store"):
        open_store(url, allow_ephemeral=True)


# -- the registry ----------------------------------------------------------------------------


def test_registering_by_string_imports_nothing() -> None:
    code = ("import sys, chatstate.stores as s\n"
            "s.register('later', 'chatstate.stores.sqlite.store:SqliteStore')\n"
            "print(sorted(m for m in sys.modules if m.startswith('chatstate.stores.')\n"
            "             and m.endswith('.store')))\n"
            "print(s.store_class('later').__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out == ["[]", "SqliteStore"]


def test_a_missing_extra_says_what_to_install() -> None:
    code = ("import sys\n"
            "sys.modules['obstore'] = None  # as if not installed\n"
            "from chatstate.stores import open_store\n"
            "open_store('s3://bucket/prefix')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 1
    assert "the s3:// store needs the 'obstore' package: pip install 'chatstate[s3]'" in \
        done.stderr, done.stderr


def test_a_third_party_missing_package_names_its_requirement(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    (tmp_path / "needy_store.py").write_text("import not_installed_anywhere_x  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register("needy", "needy_store:NeedyStore", requires="needy-store[cloud]")
    with pytest.raises(ChatstateError, match=r"pip install 'needy-store\[cloud\]'"):
        store_class("needy")


def test_bad_registrations_are_refused() -> None:
    with pytest.raises(ChatstateError, match="cannot register store scheme"):
        register("Bad Scheme", "x:Y")
    with pytest.raises(ChatstateError, match=r"package\.module:ClassName"):
        register("nocolon", "just.a.module")
    with pytest.raises(ChatstateError, match="from_url"):
        register("notastore", object)
    with pytest.raises(ChatstateError, match=r"unknown store scheme 'nosuch'.*memory://"):
        store_class("nosuch")


def test_pyproject_entry_points_name_what_the_registry_holds() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["chatstate.stores"]
    assert sorted(declared) == ["json", "memory", "postgres", "postgresql", "s3", "sqlite"]
    for scheme, target in declared.items():
        module, _, attr = target.partition(":")
        try:
            cls = store_class(scheme)
        except ChatstateError as exc:  # an extra that is not installed here
            assert "pip install" in str(exc)
            continue
        assert (cls.__module__, cls.__qualname__) == (module, attr), scheme
