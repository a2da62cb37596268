"""The batch runner's contract through the real CLI and library, against the fake model over HTTP.

Runs here go through ``common.run`` in this process (``invoke``): the same code
as the console script, with real threads, real SQLite and real files. The
kill drills, which need real processes, are in ``test_batch_drill.py``.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.batch_child import PROMPT, calls_by_record, ledger_rows, run_args, write_jsonl
from support.cli_helpers import invoke

from chatstate.batch import Batch, InputError
from chatstate.batch.ledger import Ledger
from chatstate.batch.outputs import output_name
from chatstate.testing import FakeModel

FAST_RETRIES = {"CHATSTATE_BACKOFF_BASE": "0.01"}


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel() as model:
        yield model


def _run(source: Path, out: Path, fake: FakeModel, *extra: str,
         env: dict[str, str] | None = None, pre: list[str] | None = None) -> object:
    return invoke([*(pre or []), *run_args(source, out, fake.base_url, *extra)], env=env)


def test_run_writes_one_verified_file_per_record_and_a_rerun_calls_nothing(
        tmp_path: Path, fake: FakeModel) -> None:
    ids = write_jsonl(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out"
    first = invoke(run_args(tmp_path / "in.jsonl", out, fake.base_url, "-j", "4"))
    assert first.code == 0, first.err
    assert "batch finished: 12/12 done, 0 failed" in first.out
    # the probe is printed before anything else happens
    lines = first.err.splitlines()
    assert lines[0].startswith(f"ledger {out}/.chatstate-batch.db on ")
    assert ": durable (device " in lines[0]
    assert lines[1].startswith(f"outputs {out} on ")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        sorted(f"{i}.txt" for i in ids)
    text = (out / "rec-003.txt").read_text()
    # the reply, ending with a newline as a text file does (the reply itself has none)
    reply = fake.reply_for([{"role": "user", "content": "rec-003|text of record 3"}])
    assert not reply.endswith("\n")
    assert text == reply + "\n"
    assert (os.stat(out / "rec-003.txt").st_mode & 0o777) == 0o600
    rows = ledger_rows(out / ".chatstate-batch.db")
    assert {r["status"] for r in rows.values()} == {"done"}
    assert all(r["attempts"] == 1 and len(r["output_sha256"]) == 64 for r in rows.values())

    again = invoke(run_args(tmp_path / "in.jsonl", out, fake.base_url))
    assert again.code == 0
    assert "this run: 0 done" in again.out
    assert all(len(times) == 1 for times in calls_by_record(fake.request_log).values())
    verified = invoke(["batch", "verify", "--out", str(out)])
    assert verified.code == 0, verified.out
    assert verified.out.startswith("verify ok: 12 done"), verified.out
    status = invoke(["batch", "status", "--out", str(out), "--json"])
    assert status.json()["counts"] == {"pending": 0, "running": 0, "done": 12, "failed": 0}


def test_always_failing_record_fails_after_exactly_max_attempts_calls(
        tmp_path: Path, fake: FakeModel) -> None:
    fake.add_rule(contains="FAIL-ME", status=500)
    write_jsonl(tmp_path / "in.jsonl", 4, extra={"bad": "FAIL-ME please"})
    out = tmp_path / "out"
    for _ in range(2):  # the rerun must not call it again
        result = _run(tmp_path / "in.jsonl", out, fake, "--max-attempts", "3", env=FAST_RETRIES)
        assert result.code == 1, result.err
        assert "4/5 done, 1 failed" in result.out
        assert "failed 'bad': " in result.out
        calls = calls_by_record(fake.request_log)
        assert len(calls["bad"]) == 3
        assert all(len(calls[f"rec-{i:03d}"]) == 1 for i in range(4))
    row = ledger_rows(out / ".chatstate-batch.db")["bad"]
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert "HTTP 500" in row["last_error"]
    status = invoke(["batch", "status", "--out", str(out), "--json"]).json()
    assert status["failures"][0]["id"] == "bad"
    assert invoke(["batch", "verify", "--out", str(out)]).code == 0  # failed is not inconsistent


def test_retry_failed_gives_failed_records_fresh_attempts_once_the_cause_is_fixed(
        tmp_path: Path, fake: FakeModel) -> None:
    fake.add_rule(contains="FAIL-ME", status=500)
    write_jsonl(tmp_path / "in.jsonl", 2, extra={"bad": "FAIL-ME please"})
    out = tmp_path / "out"
    first = _run(tmp_path / "in.jsonl", out, fake, "--max-attempts", "2", env=FAST_RETRIES)
    assert first.code == 1
    assert "1 failed" in first.out
    fake.reset()  # the outage is over
    plain = _run(tmp_path / "in.jsonl", out, fake, "--max-attempts", "2")
    assert plain.code == 1
    assert calls_by_record(fake.request_log) == {}  # failed stays failed
    again = _run(tmp_path / "in.jsonl", out, fake, "--max-attempts", "2", "--retry-failed")
    assert again.code == 0, again.err
    assert "retrying 1 failed record(s)" in again.err
    assert list(calls_by_record(fake.request_log)) == ["bad"]  # done records are not re-called
    row = ledger_rows(out / ".chatstate-batch.db")["bad"]
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert invoke(["batch", "verify", "--out", str(out)]).code == 0


def test_retry_after_is_honoured_and_each_request_is_an_attempt(
        tmp_path: Path, fake: FakeModel) -> None:
    fake.fail_next(429, retry_after=0.4)
    write_jsonl(tmp_path / "in.jsonl", 1)
    out = tmp_path / "out"
    result = _run(tmp_path / "in.jsonl", out, fake, "--max-attempts", "2")
    assert result.code == 0, result.err
    times = calls_by_record(fake.request_log)["rec-000"]
    assert len(times) == 2
    assert times[1] - times[0] >= 0.4
    assert ledger_rows(out / ".chatstate-batch.db")["rec-000"]["attempts"] == 2


def test_deleted_and_edited_outputs_are_detected_and_redone(tmp_path: Path,
                                                            fake: FakeModel) -> None:
    write_jsonl(tmp_path / "in.jsonl", 5)
    out = tmp_path / "out"
    assert _run(tmp_path / "in.jsonl", out, fake).code == 0
    good = (out / "rec-001.txt").read_text()
    (out / "rec-001.txt").unlink()
    (out / "rec-002.txt").write_text("edited by hand")
    broken = invoke(["batch", "verify", "--out", str(out)])
    assert broken.code == 1
    assert "record 'rec-001' is done but its output rec-001.txt is missing" in broken.out
    assert "record 'rec-002' is done but its output rec-002.txt has sha256" in broken.out

    rerun = _run(tmp_path / "in.jsonl", out, fake)
    assert rerun.code == 0, rerun.err
    assert "requeued 'rec-001' to be redone: done, but the output file is missing" in rerun.err
    assert ("requeued 'rec-002' to be redone: its output changed after it was done (the "
            "changed file was moved to .quarantine/rec-002.txt)") in rerun.err
    assert "this run: 2 done" in rerun.out
    assert (out / "rec-001.txt").read_text() == good
    assert (out / ".quarantine" / "rec-002.txt").read_text() == "edited by hand"  # never deleted
    calls = calls_by_record(fake.request_log)
    assert {k: len(v) for k, v in calls.items()} == {
        "rec-000": 1, "rec-001": 2, "rec-002": 2, "rec-003": 1, "rec-004": 1}
    assert invoke(["batch", "verify", "--out", str(out)]).code == 0


def test_an_extra_file_fails_verify_until_recover_quarantines_it(tmp_path: Path,
                                                                 fake: FakeModel) -> None:
    write_jsonl(tmp_path / "in.jsonl", 3)
    out = tmp_path / "out"
    assert _run(tmp_path / "in.jsonl", out, fake).code == 0
    (out / "stray.txt").write_text("not from the batch")
    (out / "sub").mkdir()
    (out / "sub" / "also.txt").write_text("nor this")
    result = invoke(["batch", "verify", "--out", str(out)])
    assert result.code == 1
    assert "violation: stray.txt is in the output directory but no record is done with it" \
        in result.out
    assert "violation: sub/also.txt is in the output directory" in result.out
    report = invoke(["batch", "recover", "--out", str(out)])
    assert report.code == 0
    assert "2 file(s) in the output directory belong to no done record" in report.err
    assert (out / "stray.txt").exists()  # reporting moves nothing
    moved = invoke(["batch", "recover", "--out", str(out), "--quarantine"])
    assert "quarantined stray.txt -> .quarantine/stray.txt" in moved.err
    assert "belong to no done record" not in moved.err
    assert (out / ".quarantine" / "sub" / "also.txt").read_text() == "nor this"
    assert invoke(["batch", "verify", "--out", str(out)]).code == 0


def test_a_changed_record_is_reported_and_not_overwritten(tmp_path: Path,
                                                          fake: FakeModel) -> None:
    source = tmp_path / "in.jsonl"
    write_jsonl(source, 2)
    out = tmp_path / "out"
    assert _run(source, out, fake).code == 0
    source.write_text(json.dumps({"id": "rec-000", "text": "a new text"}) + "\n"
                      + json.dumps({"id": "rec-001", "text": "text of record 1"}) + "\n"
                      + json.dumps({"text": "no id given"}) + "\n")
    result = _run(source, out, fake)
    assert result.code == 0
    assert "1 record(s) changed since they were registered and were left as registered" \
        in result.err
    assert "'rec-000'" in result.err
    rows = ledger_rows(out / ".chatstate-batch.db")
    assert rows["rec-000"]["text"] == "text of record 0"
    derived = [k for k in rows if k.startswith("r-")]
    assert len(derived) == 1
    assert rows[derived[0]]["status"] == "done"
    assert len(calls_by_record(fake.request_log)["rec-000"]) == 1


def test_directory_input_and_hostile_ids_stay_inside_the_output_directory(
        tmp_path: Path, fake: FakeModel) -> None:
    src = tmp_path / "docs"
    (src / "notes").mkdir(parents=True)
    (src / "notes" / "a.txt").write_text("alpha")
    (src / "b.md").write_text("beta")
    (src / ".hidden").write_text("skipped")
    out = tmp_path / "out"
    result = _run(src, out, fake)
    assert result.code == 0, result.err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        ["b.md.txt", "notes%2Fa.txt.txt"]
    hostile = ["../escape", "/etc/passwd", ".hidden", "a/../../b", "..", "", "x" * 600,
               "ü/ß", "a%2Fb", "a/b", "con", "tab\there"]
    names = [output_name(h) for h in hostile]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name
        assert not name.startswith(".")
        assert len(name) <= 210
        assert (out / name).resolve().parent == out.resolve()


@pytest.mark.parametrize("case", ["file-name-not-utf8", "lone-surrogate", "deep-nesting"])
def test_input_that_cannot_be_a_record_is_named_before_anything_runs(
        tmp_path: Path, fake: FakeModel, case: str) -> None:
    # each was "error: unexpected UnicodeEncodeError/RecursionError ... please report it",
    # naming no file or line
    if case == "file-name-not-utf8":
        source = tmp_path / "dir"
        source.mkdir()
        (source / "ok.txt").write_text("hello")
        with open(os.path.join(os.fsencode(source), b"caf\xe9.txt"), "w") as fh:
            fh.write("caf")
        named = "caf\\xe9.txt"
    else:
        source = tmp_path / "in.jsonl"
        bad = '{"id": "b", "text": "\\ud800"}' if case == "lone-surrogate" else "[" * 100_000
        source.write_text('{"id": "a", "text": "fine"}\n' + bad + "\n")
        named = f"{source.name}:2"
    result = _run(source, tmp_path / "out", fake)
    assert result.code == 1
    assert named in result.err, result.err
    assert "unexpected" not in result.err
    assert fake.request_log == []


@pytest.mark.invariant(8)
def test_ephemeral_locations_are_refused_unless_allowed(tmp_path: Path, fake: FakeModel) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip(reason="no /dev/shm here")
    write_jsonl(tmp_path / "in.jsonl", 2)
    shm = Path("/dev/shm") / f"chatstate-batch-test-{uuid.uuid4().hex[:8]}"
    try:
        refused = _run(tmp_path / "in.jsonl", shm / "out", fake)
        assert refused.code == 1, refused.err
        assert "error: refusing batch ledger at /dev/shm/" in refused.err
        assert "; batch outputs at /dev/shm/" in refused.err
        assert "--allow-ephemeral" in refused.err
        assert not shm.exists()
        # ledger on a RAM disk, outputs on disk: allowed explicitly, with a warning
        split = _run(tmp_path / "in.jsonl", tmp_path / "out", fake, "--ledger",
                     str(shm / "ledger.db"), pre=["--allow-ephemeral"])
        assert split.code == 0, split.err
        assert ": ephemeral (device" in split.err
        assert "are on different devices: they would not survive the same events" in split.err
    finally:
        for p in sorted(shm.rglob("*"), reverse=True) if shm.exists() else []:
            p.unlink() if p.is_file() else p.rmdir()
        if shm.exists():
            shm.rmdir()


def test_transcripts_keep_each_call_as_a_replayable_conversation(tmp_path: Path,
                                                                 fake: FakeModel) -> None:
    write_jsonl(tmp_path / "in.jsonl", 2)
    out, store = tmp_path / "out", f"json://{tmp_path}/store"
    result = _run(tmp_path / "in.jsonl", out, fake, "--transcripts", "--system", "be brief",
                  pre=["--store", store])
    assert result.code == 0, result.err
    row = ledger_rows(out / ".chatstate-batch.db")["rec-001"]
    assert row["conversation_id"].startswith("batch-")
    replay = invoke(["replay", row["conversation_id"], "--format", "json"], store=store)
    messages = replay.json()["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[2]["content"] + "\n" == (out / "rec-001.txt").read_text()


def test_limit_and_the_library_call(tmp_path: Path, fake: FakeModel) -> None:
    notes: list[str] = []
    with Batch(tmp_path / "out", prompt=PROMPT, base_url=fake.base_url, model="fake-model",
               concurrency=2, echo=notes.append) as batch:
        first = batch.run([{"id": "a", "text": "one"}, {"id": "b", "text": "two"}, "three"],
                          limit=2)
        assert (first.done_now, first.counts["pending"], first.ok) == (2, 1, True)
        assert batch.verify() == []  # pending records are not a violation
        second = batch.run()
        assert second.counts == {"pending": 0, "running": 0, "done": 3, "failed": 0}
        assert batch.status()["done"] == 3
        assert batch.verify() == []
    assert any(n.startswith("ledger ") for n in notes)
    with pytest.raises(ValueError, match="must contain"):
        Batch(tmp_path / "x", prompt="no placeholder")


def test_concurrent_claims_never_hand_out_a_record_twice(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path / "ledger.db", create=True)
    ledger.register((f"r{i}", "t", "sha", f"r{i}.txt") for i in range(300))
    claimed: list[str] = []

    def claim_all(worker: str) -> None:
        while (claim := ledger.claim(worker, max_attempts=3)) is not None:
            assert ledger.count_attempt(claim.id, worker, 3)
            claimed.append(claim.id)

    threads = [threading.Thread(target=claim_all, args=(f"w{n}",)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ledger.close()
    assert sorted(claimed) == sorted(f"r{i}" for i in range(300))


def test_an_input_inside_the_output_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "in.jsonl").write_text('{"text": "x"}\n')
    with Batch(out, echo=lambda line: None) as batch, pytest.raises(InputError, match="inside"):
        batch.add(out / "in.jsonl")
    assert not (out / ".chatstate-batch.db").exists()


def test_an_external_ledger_belongs_to_one_output_directory(tmp_path: Path,
                                                           fake: FakeModel) -> None:
    ledger = tmp_path / "state" / "ledger.db"
    missing = invoke(["batch", "status", "--out", str(tmp_path / "a"), "--ledger", str(ledger)])
    assert missing.code == 1
    assert f"no batch ledger at {ledger}" in missing.err
    write_jsonl(tmp_path / "in.jsonl", 1)
    assert _run(tmp_path / "in.jsonl", tmp_path / "a", fake, "--ledger", str(ledger)).code == 0
    other = _run(tmp_path / "in.jsonl", tmp_path / "b", fake, "--ledger", f"sqlite://{ledger}")
    assert other.code == 1
    assert f"ledger {ledger} belongs to output directory {tmp_path / 'a'}" in other.err
    assert not (tmp_path / "b").exists()


def test_a_changed_prompt_on_the_same_output_directory_is_refused(
        tmp_path: Path, fake: FakeModel) -> None:
    write_jsonl(tmp_path / "in.jsonl", 2)
    out = tmp_path / "out"
    first = _run(tmp_path / "in.jsonl", out, fake)
    assert first.code == 0, first.err
    other = invoke(["batch", "run", str(tmp_path / "in.jsonl"), "--prompt", "Other: {text}",
                    "--out", str(out), "--base-url", fake.base_url, "--model", "m"])
    assert other.code == 1
    assert "was started with another prompt" in other.err
    assert "Traceback" not in other.err
    odd = invoke(["batch", "run", str(tmp_path / "in.jsonl"), "--prompt", "{title}: {text}",
                  "--out", str(tmp_path / "out2"), "--base-url", fake.base_url, "--model", "m"])
    assert odd.code == 0
    assert "{title} in the prompt is not a placeholder" in odd.err


def test_a_record_whose_conversation_another_writer_holds_waits_for_a_later_run(
        tmp_path: Path, fake: FakeModel) -> None:
    """With transcripts, another live writer (another process) on one record's conversation
    does not end the worker: the other records finish, that one is left pending saying
    why, and a run after the other writer lets go completes it."""
    import signal
    import socket
    import subprocess
    import sys

    from support import SUPPORT

    from chatstate.batch._work import conversation_id
    from chatstate.stores import open_store

    out, url = tmp_path / "out", f"json://{tmp_path}/store"
    notes: list[str] = []
    with Batch(out, prompt=PROMPT, base_url=fake.base_url, model="fake-model", concurrency=2,
               transcripts=open_store(url), echo=notes.append) as batch:
        batch.add([{"id": rid, "text": rid} for rid in ("a", "b", "c")])
        ledger = Ledger.open(out / ".chatstate-batch.db", create=False)
        cid = conversation_id(str(ledger.meta("batch_id")), "b")
        ledger.close()
        holder = subprocess.Popen([sys.executable, str(SUPPORT / "lease_holder.py"), url, cid,
                                   "300"], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith("held ")
            first = batch.run()
            assert (first.done_now, first.counts["pending"], first.counts["failed"]) == \
                (2, 1, 0)
            row = ledger_rows(out / ".chatstate-batch.db")["b"]
            assert row["status"] == "pending"
            assert f"in use by host {socket.gethostname()}, pid {holder.pid}" in \
                row["last_error"], row
            assert any("'b'" in n and "pending" in n for n in notes), notes
            assert not (out / output_name("b")).exists()
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
        second = batch.run()  # the holder is gone (its pid is dead on this host)
        assert second.counts == {"pending": 0, "running": 0, "done": 3, "failed": 0}
        assert (out / output_name("b")).read_text()
