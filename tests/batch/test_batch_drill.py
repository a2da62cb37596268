"""kill -9 drills for the batch runner: real runner processes, the fake model in this process.

The fake model's request log lives here, so it outlives every runner and says
exactly which record was called when. The ledger says when each record became
done; together they prove no record is called again once it is done.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.batch_child import calls_by_record, epoch, ledger_rows, run_args, spawn, write_jsonl
from support.cli_helpers import cli_env, invoke

from chatstate.batch.outputs import TEMP_RE, output_name
from chatstate.testing import FakeModel


def wait_until(cond: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def holders(out: Path) -> set[str]:
    """The workers holding running records right now."""
    path = out / ".chatstate-batch.db"
    if not path.exists():
        return set()
    return {r["worker"] for r in ledger_rows(path).values() if r["status"] == "running"}


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def stopped(pid: int) -> bool:
    return state(pid) in ("T", "t")


def zombie(pid: int) -> bool:
    return state(pid) == "Z"


def kill_mid_write(proc: subprocess.Popen[str], out: Path) -> str | None:
    """Freeze the runner the moment a temp output exists; SIGKILL it if it is still there."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [n for n in (os.listdir(out) if out.is_dir() else []) if TEMP_RE.match(n)]
        if temps:
            proc.send_signal(signal.SIGSTOP)
            wait_until(lambda: stopped(proc.pid), 5, "SIGSTOP")
            caught = [n for n in temps if (out / n).exists()]
            if caught:
                proc.kill()
                return caught[0]
            proc.send_signal(signal.SIGCONT)
    proc.kill()
    return None


@pytest.mark.invariant(7)
def test_kill_drill_every_record_done_once_and_never_called_after_done(tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out"
    ids = write_jsonl(source, 100)
    env = cli_env(tmp_path)
    seed = int(time.time())
    rng = random.Random(seed)
    kills, mid_write_temps, stderr = 0, [], []
    with FakeModel(latency=0.1) as fake:
        args = run_args(source, out, fake.base_url, "-j", "4", "--max-attempts", "5")
        for round_ in range(5):
            seen = len(fake.request_log)
            big = round_ == 1 or (round_ > 1 and not mid_write_temps)
            fake.configure(reply_words=150_000 if big else 8)  # ~1 MB outputs: slow writes
            proc = spawn(args, env)
            wait_until(lambda n=seen: len(fake.request_log) > n, what="the runner's first request")
            if big:
                temp = kill_mid_write(proc, out)
                if temp is not None and (out / temp).exists():
                    mid_write_temps.append(temp)  # the kill left a half-written temp behind
            else:
                time.sleep(rng.uniform(0.05, 0.4))
                proc.kill()
            _, err = proc.communicate(timeout=30)
            stderr.append(err)
            assert proc.returncode == -signal.SIGKILL, f"round {round_} (seed {seed}): {err}"
            kills += 1
        fake.configure(reply_words=8)
        final = spawn(args, env)
        final_out, final_err = final.communicate(timeout=60)
        log = fake.request_log
    assert final.returncode == 0, final_err
    assert kills >= 3, f"no kill landed mid-write (seed {seed})"
    assert mid_write_temps, f"no kill landed mid-write (seed {seed})"
    # the run after the mid-write kill removed the temp file it left
    assert any("temp file(s) of killed writes" in e for e in [*stderr[2:], final_err])
    verified = invoke(["batch", "verify", "--out", str(out)])
    assert verified.code == 0, verified.out
    rows = ledger_rows(out / ".chatstate-batch.db")
    assert sorted(rows) == sorted(ids)
    assert {r["status"] for r in rows.values()} == {"done"}
    on_disk = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    assert on_disk == {output_name(i) for i in ids}
    calls = calls_by_record(log)
    for rid in ids:
        done_at = epoch(rows[rid]["done_at"])
        assert calls[rid], f"{rid} is done but the model was never called for it"
        assert all(t < done_at for t in calls[rid]), f"{rid} called after it was done (seed {seed})"
        assert (out / output_name(rid)).read_text().startswith(f"Echo: {rid}|")
    assert f"batch finished: {len(ids)}/{len(ids)} done, 0 failed" in final_out


def test_two_runners_on_one_ledger_never_call_a_record_twice(tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out"
    ids = write_jsonl(source, 60)
    env = cli_env(tmp_path)
    # Slow until both runners hold records, however slowly the second one starts up.
    with FakeModel(latency=1.0) as fake:
        args = run_args(source, out, fake.base_url, "-j", "4")
        first = spawn(args, env)
        wait_until(lambda: len(fake.request_log) > 0, 60, "the first runner's requests")
        # recovery while a runner is alive must leave its rows alone
        report = invoke(["batch", "recover", "--out", str(out)])
        assert report.code == 0, report.err
        assert re.search(r"left \d+ record\(s\) alone: held by worker", report.err), report.err
        second = spawn(args, env)
        wait_until(lambda: len(holders(out)) == 2, 60, "both runners to hold records")
        fake.configure(latency=0.05)
        results = [p.communicate(timeout=60) for p in (first, second)]
        log = fake.request_log
    assert first.returncode == 0, results
    assert second.returncode == 0, results
    calls = calls_by_record(log)
    assert sorted(calls) == sorted(ids)
    assert [rid for rid, times in calls.items() if len(times) != 1] == []
    done_now = [int(re.search(r"this run: (\d+) done", out_).group(1))  # type: ignore[union-attr]
                for out_, _ in results]
    assert sum(done_now) == len(ids), done_now
    assert min(done_now) > 0, done_now
    assert invoke(["batch", "verify", "--out", str(out)]).code == 0


def test_attempts_count_when_sent_across_kills(tmp_path: Path) -> None:
    """Killed between attempts twice, a record that always fails still gets exactly 3 calls.

    The killed runners are left unreaped: a zombie still has its pid in /proc, and
    must count as dead all the same.
    """
    source, out = tmp_path / "in.jsonl", tmp_path / "out"
    write_jsonl(source, 0, extra={"bad": "FAIL-ME always"})
    env = cli_env(tmp_path, CHATSTATE_BACKOFF_BASE="0.6")  # kills land in the backoff sleep
    with FakeModel() as fake:
        fake.add_rule(contains="FAIL-ME", status=503)
        args = run_args(source, out, fake.base_url, "--max-attempts", "3")
        killed = []
        for calls in (1, 2):
            proc = spawn(args, env)
            wait_until(lambda n=calls: len(fake.request_log) >= n, what=f"call {calls}")
            proc.kill()  # not reaped until the end: a zombie's pid is still in /proc
            wait_until(lambda p=proc: zombie(p.pid), 10, "the killed runner to die")
            killed.append(proc)
            if calls == 1:  # what a kill leaves is a violation until the next run recovers it
                stuck = invoke(["batch", "verify", "--out", str(out)])
                assert stuck.code == 1
                assert "record 'bad' is 'running' but its worker " in stuck.out
        final = spawn(args, env)
        _, final_err = final.communicate(timeout=60)
        log = fake.request_log
        for proc in killed:
            proc.communicate(timeout=10)
    assert final.returncode == 1, final_err
    assert len(calls_by_record(log)["bad"]) == 3
    row = ledger_rows(out / ".chatstate-batch.db")["bad"]
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert "requeued 'bad': their worker died mid-record" in final_err


@pytest.mark.parametrize("how", ["--host-id", "CHATSTATE_HOST_ID"])
def test_a_killed_runner_under_a_host_id_is_recovered_by_the_next_run(tmp_path: Path,
                                                                       how: str) -> None:
    # its rows stayed 'running' forever: a worker registered under a host id that is not
    # the hostname counted as on another host, so it could never be found dead (and the
    # rerun exited 0 leaving them)
    source, out = tmp_path / "in.jsonl", tmp_path / "out"
    ids = write_jsonl(source, 20)
    env = cli_env(tmp_path, **({"CHATSTATE_HOST_ID": "box-a"} if how != "--host-id" else {}))
    extra = ["--host-id", "box-a"] if how == "--host-id" else []
    with FakeModel(latency=0.5) as fake:
        args = run_args(source, out, fake.base_url, "-j", "4", *extra)
        killed = spawn(args, env)
        wait_until(lambda: len(fake.request_log) >= 2, 60, "the runner's requests")
        killed.kill()  # with requests in flight: their records are 'running', held by it
        killed.communicate(timeout=10)
        fake.configure(latency=0.0)
        again = spawn(args, env)
        _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert "their worker died mid-record" in err, err
    rows = ledger_rows(out / ".chatstate-batch.db")
    assert sorted(rid for rid, r in rows.items() if r["status"] == "done") == sorted(ids)
    assert invoke(["batch", "verify", "--out", str(out)]).code == 0
