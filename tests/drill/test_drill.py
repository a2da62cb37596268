"""`chatstate drill` through the CLI: it kills writers in every phase, finds no loss on the
real stores, leaves the user's conversation alone, cleans up after itself, and does report
loss when a store really loses acknowledged messages.

The drill runs in this process (``invoke``), its writers in a forked fork server and its
fake model in a thread here, exactly as a user's ``chatstate drill`` would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import invoke
from support.drill_runs import assert_clean, drill
from support.stores import local_path, new_conversation, scheme
from support.tiers import S3_MISSING, need_s3

from chatstate.core.transcript import Message
from chatstate.stores import open_store

if S3_MISSING is None:  # only a missing extra may leave S3 out; a broken import fails
    from support.s3server import new_bucket_url

PHASES = ("before_call", "mid_stream", "in_store_write")
MINE = "my-own-chat"

pytestmark = pytest.mark.slow


def seed_user_conversation(url: str) -> None:
    """The user's conversation, with a stored in-progress reply, made before the drill."""
    store = open_store(url)
    try:
        msgs = new_conversation(store, MINE, 3, title="not the drill's")
        store.save_partial(MINE, Message.seal(msgs[-1], role="assistant", content="half a rep",
                                              turn_id="t-1", status="partial"))
    finally:
        store.close()


def user_state(url: str) -> tuple[Any, dict[str, bytes]]:
    """The user's conversation as loaded (hashes and all), and for json its files' bytes."""
    store = open_store(url)
    try:
        loaded = store.load(MINE).model_dump()
        ids = [s.id for s in store.list_conversations()]
    finally:
        store.close()
    assert ids == [MINE], f"conversations left in the store: {ids}"
    files: dict[str, bytes] = {}
    if scheme(url) == "json":
        root = local_path(url)
        files = {p: (root / p).read_bytes() for p in (f"{MINE}.json", f".partials/{MINE}.json")}
    return loaded, files


@pytest.mark.invariant(2, 4, 7)
def test_drill_kills_in_every_phase_and_loses_nothing(local_store_url: str) -> None:
    seed_user_conversation(local_store_url)
    before = user_state(local_store_url)
    code, doc, err = drill(local_store_url, "--trials", "20", "--seed", "1")
    assert code == 0, f"exit {code}: {doc}\n{err}"
    assert_clean(doc, 20)
    assert all(doc["kills"][phase] > 0 for phase in PHASES), doc["kills"]
    assert doc["seed"] == 1
    assert doc["run_id"]
    assert user_state(local_store_url) == before  # untouched; no drill conversation left
    if scheme(local_store_url) == "json":
        locks = sorted(p.name for p in (local_path(local_store_url) / ".locks").iterdir())
        assert locks == [f"{MINE}.lock"], locks


@pytest.mark.invariant(2, 4, 7)
def test_drill_on_s3(request: pytest.FixtureRequest) -> None:
    need_s3()
    moto_endpoint = request.getfixturevalue("moto_endpoint")
    url = new_bucket_url(moto_endpoint)
    seed_user_conversation(url)
    before = user_state(url)
    code, doc, err = drill(url, "--trials", "8", "--seed", "2")
    assert code == 0, f"exit {code}: {doc}\n{err}"
    assert_clean(doc, 8)
    assert doc["kills"]["in_store_write"] > 0, doc["kills"]
    assert user_state(url) == before
    store = open_store(url)
    try:
        keys = [k for prefix in ("conversations", "index") for k, _ in store.io.keys(prefix)]
    finally:
        store.close()
    assert keys, keys
    assert not [k for k in keys if "drill-" in k], keys


LOSSY_STORE = '''
"""A json store that acknowledges about a third of its appends without writing them."""
from pathlib import Path

from chatstate.stores.json.store import JsonStore


class LossyStore(JsonStore):
    @classmethod
    def from_url(cls, url):
        return cls(Path(url.split("://", 1)[1]), url)

    def append(self, conversation_id, messages, *, fence=None):
        if messages and int(messages[-1].hash, 16) % 3 == 0:
            return  # "acknowledged": the caller believes it is durable
        super().append(conversation_id, messages, fence=fence)
'''


def lossy_plugin(root: Path) -> Path:
    """A test-only store registered under the chatstate.stores entry point group."""
    root.mkdir()
    (root / "lossy_store.py").write_text(LOSSY_STORE)
    info = root / "lossy_store-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lossy-store\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[chatstate.stores]\n"
                                           "lossyjson = lossy_store:LossyStore\n")
    return root


def test_drill_detects_a_store_that_loses_acknowledged_messages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = lossy_plugin(tmp_path / "plugin")
    monkeypatch.syspath_prepend(str(plugin))
    url = f"lossyjson://{tmp_path}/lossy"
    code, doc, err = drill(url, "--trials", "12", "--seed", "3",
                           env={"PYTHONPATH": str(plugin)})
    assert code == 1, f"exit {code}: {doc}\n{err}"
    assert doc["ok"] is False, doc
    assert doc["lost"] > 0, doc
    assert any("acknowledged seq" in p and "missing" in p for p in doc["problems"]), doc


def test_drill_all_runs_every_store_in_a_scratch_dir_it_removes(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """json and sqlite next to the configured store; s3 too when CHATSTATE_DRILL_S3 names one."""
    base = tmp_path / "base"
    s3 = "" if S3_MISSING else new_bucket_url(request.getfixturevalue("moto_endpoint"))
    result = invoke(["--store", f"json://{base}/store", "drill", "--all", "--trials", "3",
                     "--seed", "4", "--json"], env={"CHATSTATE_DRILL_S3": s3})
    assert result.code == 0, (result.out, result.err)
    doc = result.json()
    assert doc["ok"] is True
    kinds = [d["store"].split("://")[0] for d in doc["stores"]]
    assert kinds == ["json", "sqlite"] + (["s3"] if s3 else [])
    assert all(d["trials"] == 3 and d["problems"] == [] for d in doc["stores"])
    assert list(base.iterdir()) == []  # the drill dir is gone


def test_the_table_names_every_phase_and_the_verdict(tmp_path: Path) -> None:
    result = invoke(["drill", "--store", f"sqlite://{tmp_path}/t.db", "--trials", "3"])
    assert result.code == 0, result.err
    for column in ("trials", "before call", "mid-stream", "in store write", "acked", "lost",
                   "corrupt", "duplicated", "recovered"):
        assert column in result.out
    assert "PASS: nothing acknowledged was lost" in result.out


def test_the_writer_imports_no_openai_sdk() -> None:
    code = ("import sys, chatstate.drill.writer as w; w.make_adapter('http://127.0.0.1:9/v1'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('openai', 'pydantic_settings', 'rich', 'click')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


REPORTING_STORE = '''
"""A third-party store that reports its own leftovers (the optional Store protocol parts)."""
import json
from pathlib import Path

from chatstate.stores.json.store import JsonStore


class ReportingStore(JsonStore):
    @classmethod
    def from_url(cls, url):
        return cls(Path(url.split("://", 1)[1]), url)

    def leftovers(self, conversation_ids, counts):
        return [f"reporting store: debris of {cid}" for cid in sorted(conversation_ids)][:1]

    def forget(self, conversation_ids):
        (self.root.parent / "forgotten.json").write_text(json.dumps(sorted(conversation_ids)))
'''


def test_drill_asks_a_third_party_store_for_its_own_leftovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "reporting_store.py").write_text(REPORTING_STORE)
    info = plugin / "reporting_store-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reporting-store\n"
                                   "Version: 0.0\n")
    (info / "entry_points.txt").write_text("[chatstate.stores]\n"
                                           "reporting = reporting_store:ReportingStore\n")
    monkeypatch.syspath_prepend(str(plugin))
    code, doc, err = drill(f"reporting://{tmp_path}/store", "--trials", "2", "--seed", "5",
                           env={"PYTHONPATH": str(plugin)})
    assert code == 1, f"exit {code}: {doc}\n{err}"
    assert any(p.startswith("reporting store: debris of drill-") for p in doc["problems"]), doc
    forgotten = json.loads((tmp_path / "forgotten.json").read_text())
    assert forgotten
    assert all(cid.startswith("drill-") for cid in forgotten)
