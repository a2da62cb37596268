"""migrate() between json, sqlite and s3 (a real moto server): round trips, conflicts, kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from support.migrate_corpus import CORPUS, TOTAL, build_corpus, local, state
from support.s3server import moto_endpoint, new_bucket_url

from chatstate.core.transcript import Conversation, Message
from chatstate.ops.migrate import migrate
from chatstate.stores import open_store

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here

def canon(records: list[dict[str, Any]]) -> set[str]:
    return {json.dumps(r, sort_keys=True) for r in records}


def test_round_trip_json_sqlite_s3_json(tmp_path: Path, moto_endpoint: str) -> None:
    src = local(f"json://{tmp_path}/a")
    build_corpus(src)
    expected = state(src)
    assert sum(len(v[2]) for v in expected.values()) == TOTAL + 2
    sq = local(f"sqlite://{tmp_path}/b.db")
    s3 = open_store(new_bucket_url(moto_endpoint))
    back = local(f"json://{tmp_path}/c")
    for a, b in ((src, sq), (sq, s3), (s3, back)):
        report = migrate(a, b)
        assert report.ok, report.to_dict()
        assert sorted(report.copied) == sorted(CORPUS)
        assert report.partials_copied == 2
        assert report.messages_copied == TOTAL + 2
        assert state(b) == expected
    assert canon(src.opens()) <= canon(back.opens())
    again = migrate(src, sq)
    assert again.ok
    assert again.copied == []
    assert sorted(again.skipped) == sorted(CORPUS)
    assert again.messages_copied == 0
    assert again.partials_copied == 0


def test_divergent_destination_is_reported_and_untouched(tmp_path: Path) -> None:
    src = local(f"json://{tmp_path}/a")
    build_corpus(src)
    dst = local(f"sqlite://{tmp_path}/b.db")
    dst.create(Conversation(id="alpha", title="Title of alpha"))
    other = Message.seal(None, role="user", content="something else", turn_id="t-x")
    dst.append("alpha", [other])
    dst.create(Conversation(id="gamma", title="Renamed at the destination"))
    before = state(dst)
    report = migrate(src, dst, progress=lambda line: None)
    assert not report.ok
    assert set(report.conflicts) == {"alpha", "gamma"}
    assert "seq 0 differs" in report.conflicts["alpha"]
    assert "title" in report.conflicts["gamma"]
    after = state(dst)
    assert after["alpha"] == before["alpha"]
    assert after["gamma"] == before["gamma"]
    assert sorted(report.copied) == ["beta", "delta", "eps.v2_x"]
    assert after["beta"] == state(src)["beta"]


def test_corrupt_source_conversation_is_reported_not_copied(tmp_path: Path,
                                                            moto_endpoint: str) -> None:
    src = local(f"json://{tmp_path}/a")
    build_corpus(src)
    path = tmp_path / "a" / "gamma.json"
    path.write_bytes(path.read_bytes().replace(b"question 0", b"question X"))
    dst = open_store(new_bucket_url(moto_endpoint))
    report = migrate(src, dst)
    assert set(report.failed) == {"gamma"}
    assert "gamma.json" in report.failed["gamma"]
    assert "gamma" not in state(dst)
    assert len(report.copied) == len(CORPUS) - 1


MIGRATE_SCRIPT = textwrap.dedent("""
    import sys
    from chatstate.ops.migrate import migrate
    from chatstate.stores import open_store
    src, dst = open_store(sys.argv[1]), open_store(sys.argv[2])
    report = migrate(src, dst, batch_size=4, progress=lambda line: print(line, flush=True))
    print("DONE", report.ok, flush=True)
""")


def test_killed_migrate_resumes_to_the_same_result(tmp_path: Path, moto_endpoint: str) -> None:
    src_url = f"json://{tmp_path}/a"
    build_corpus(local(src_url))
    dst_url = new_bucket_url(moto_endpoint)
    env = dict(os.environ, CHATSTATE_ALLOW_EPHEMERAL="1")
    proc = subprocess.Popen([sys.executable, "-c", MIGRATE_SCRIPT, src_url, dst_url],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    seen = [proc.stdout.readline() for _ in range(12)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert not any(line.startswith("DONE") for line in seen), seen
    dst = open_store(dst_url)
    partway = state(dst)
    assert sum(len(v[2]) for v in partway.values()) < TOTAL + 2  # it really was cut short
    report = migrate(local(src_url), dst, batch_size=4)
    assert report.ok, report.to_dict()
    clean = open_store(new_bucket_url(moto_endpoint))
    assert migrate(local(src_url), clean).ok
    assert state(dst) == state(clean) == state(local(src_url))
    assert migrate(local(src_url), dst).messages_copied == 0


def test_rerun_after_the_source_finished_a_streamed_reply(tmp_path: Path) -> None:
    src = local(f"json://{tmp_path}/a")
    build_corpus(src)
    dst = local(f"sqlite://{tmp_path}/b.db")
    assert migrate(src, dst).ok
    beta = src.load("beta")
    assert beta.partial is not None
    assert dst.load("beta").partial is not None
    src.append("beta", [Message.seal(beta.last, role="assistant", content="half a reply",
                                     turn_id=beta.partial.turn_id)])
    report = migrate(src, dst)
    assert report.ok
    assert report.copied == ["beta"]
    assert report.messages_copied == 1
    assert state(dst)["beta"] == state(src)["beta"]
    assert dst.load("beta").partial is None
