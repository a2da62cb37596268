"""Batch across hosts: one PostgreSQL ledger, outputs on S3 (moto), workers as separate hosts.

The drill runs three real worker processes with distinct host ids against the
fake model in this process (its request log counts every call per record).
One worker is SIGKILLed mid-run; another is SIGSTOPped for longer than its
lease and woken late. The run must finish on the others, ``batch verify``
must pass with exactly one output object per record, and the model calls
beyond one per record must be at most the requests those two had in flight.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.batch_child import PROMPT, calls_by_record, spawn, write_jsonl
from support.cli_helpers import cli_env, invoke
from support.pgserver import PgServer, pg_server  # noqa: F401  (fixture)
from support.s3server import moto_endpoint, new_bucket_url, object_keys  # noqa: F401  (fixture)

from chatstate.batch import Batch
from chatstate.batch.outputs import output_name
from chatstate.testing import FakeModel

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed: "
                             "pip install 'chatstate[postgres]'")
LEASE = 2.0


def wait_until(cond: Callable[[], bool], timeout: float = 90.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def query(ledger_url: str, sql: str) -> list[tuple[object, ...]]:
    """Read the ledger as an operator would; nothing yet before the first worker made it."""
    with psycopg.connect(ledger_url, autocommit=True) as db:
        try:
            return db.execute(sql).fetchall()  # type: ignore[arg-type]
        except psycopg.errors.UndefinedTable:
            return []


def held(ledger_url: str) -> dict[str, list[str]]:
    """host id -> the records its worker holds (running) right now."""
    rows = query(ledger_url, "SELECT id, worker FROM chatstate_batch.records "
                 "WHERE status='running'")
    out: dict[str, list[str]] = {}
    for rid, worker in rows:
        out.setdefault(str(worker).split(":", 1)[0], []).append(str(rid))
    return out


def done_count(ledger_url: str) -> int:
    rows = query(ledger_url, "SELECT count(*) FROM chatstate_batch.records WHERE status='done'")
    return int(str(rows[0][0])) if rows else 0


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def freeze_holding(proc: subprocess.Popen[str], host: str, ledger_url: str) -> list[str]:
    """SIGSTOP the worker at a moment it holds records (requests in flight); returns them."""
    for _ in range(200):
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(proc.pid), 10, "the SIGSTOP")
        holding = held(ledger_url).get(host, [])
        if holding:
            return holding
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"{host} never held a record when stopped")


@pytest.fixture
def shared(pg_server: PgServer, moto_endpoint: str) -> tuple[str, str]:  # noqa: F811
    """(ledger URL, outputs URL): a fresh database and a fresh bucket."""
    return pg_server.new_database(), new_bucket_url(moto_endpoint, "outputs")


def test_three_hosts_survive_a_kill_and_a_freeze(tmp_path: Path,
                                                 shared: tuple[str, str]) -> None:
    ledger, out = shared
    source = tmp_path / "in.jsonl"
    ids = write_jsonl(source, 90)
    env = cli_env(tmp_path)
    with FakeModel(latency=0.4) as fake:
        args = ["batch", "run", str(source), "--prompt", PROMPT, "--out", out, "--ledger",
                ledger, "--base-url", fake.base_url, "--model", "fake-model", "-j", "2",
                "--lease", str(LEASE)]
        workers = [spawn([*args, "--host-id", f"host-{n}"], env) for n in range(3)]
        try:
            wait_until(lambda: done_count(ledger) >= 12, what="the first dozen records")
            at_kill = freeze_holding(workers[0], "host-0", ledger)
            workers[0].kill()  # frozen first, so what it held is exactly what it had in flight
            workers[0].wait(timeout=30)
            at_stop = freeze_holding(workers[1], "host-1", ledger)
            # host-2 must take over both lapsed leases while host-1 is frozen
            wait_until(lambda: not held(ledger).get("host-0") and not held(ledger).get("host-1"),
                       what="host-2 taking over the lapsed leases")
            time.sleep(LEASE)
            workers[1].send_signal(signal.SIGCONT)
            _, late_err = workers[1].communicate(timeout=120)
            _, last_err = workers[2].communicate(timeout=120)
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                    proc.wait()
        log = fake.request_log
    assert workers[0].returncode == -signal.SIGKILL
    assert workers[1].returncode == 0, late_err
    assert workers[2].returncode == 0, last_err
    assert at_kill, "the kill and the stop must each catch requests in flight"
    assert at_stop, "the kill and the stop must each catch requests in flight"
    # the late worker's results for records taken over were refused, logged and dropped
    assert "dropped the reply" in late_err or "refused to write" in late_err, late_err
    verified = invoke(["batch", "verify", "--out", out, "--ledger", ledger])
    assert verified.code == 0, verified.out + verified.err
    assert f"verify ok: {len(ids)} done record(s)" in verified.out
    assert sorted(object_keys(out, "")) == sorted(output_name(i) for i in ids)
    calls = calls_by_record(log)
    assert sorted(calls) == sorted(ids), "every record was called"
    extra = sum(len(c) for c in calls.values()) - len(ids)
    assert extra <= len(at_kill) + len(at_stop), (extra, at_kill, at_stop)
    status = invoke(["batch", "status", "--out", out, "--ledger", ledger, "--json"])
    assert status.code == 0
    assert f'"done": {len(ids)}' in status.out


def test_a_late_write_never_replaces_the_taken_over_output(shared: tuple[str, str]) -> None:
    """The create-only put itself: whoever writes second is refused and changes nothing."""
    ledger, out = shared
    with Batch(out, ledger=ledger, echo=lambda line: None) as batch:
        first = batch.outputs.write("r.txt", b"the output of the worker that took over")
        late = batch.outputs.write("r.txt", b"a late worker's reply")
        assert first.taken is None
        assert late.taken == batch.outputs.sha256("r.txt")
    assert object_keys(out, "") == ["r.txt"]


def test_a_claim_whose_lease_lapsed_is_taken_over_and_its_attempt_counted(
        shared: tuple[str, str]) -> None:
    from chatstate.batch.pgledger import PgLedger

    ledger_url, _ = shared
    db = PgLedger(ledger_url, lease=0.5)
    try:
        db.register([("a", "text", "sha", "a.txt")])
        first = db.claim("host-a:1", 3, count=True)
        assert first is not None
        assert db.claim("host-b:2", 3, count=True) is None
        assert db.renew("host-a:1") == 1
        time.sleep(0.8)
        taken = db.claim("host-b:2", 3, count=True)
        assert taken is not None
        assert taken.attempts == 1  # host-a's attempt is counted
        # host-a wakes up: every step it tries is refused
        assert not db.set_writing("a", "host-a:1", "x")
        assert not db.finish("a", "host-a:1", "x")
        assert db.renew("host-a:1") == 0
        assert db.set_writing("a", "host-b:2", "y")
        assert db.finish("a", "host-b:2", "y")
        assert db.counts()["done"] == 1
    finally:
        db.close()


def test_s3_outputs_need_a_shared_ledger(tmp_path: Path, moto_endpoint: str) -> None:  # noqa: F811
    url = new_bucket_url(moto_endpoint, "o")
    result = invoke(["batch", "status", "--out", url])
    assert result.code != 0
    assert "need a shared ledger: pass --ledger postgresql://" in result.out + result.err


def test_a_server_that_acknowledges_before_flushing_is_refused(shared: tuple[str, str],
                                                               pg_server: PgServer,  # noqa: F811
                                                               ) -> None:
    ledger_url, out = shared
    name = ledger_url.rsplit("/", 1)[1]
    pg_server.sql(f"ALTER DATABASE {name} SET synchronous_commit = off")
    result = invoke(["batch", "status", "--out", out, "--ledger", ledger_url])
    assert result.code != 0
    assert "synchronous_commit=off" in result.out + result.err
    assert "--allow-ephemeral" in result.out + result.err



def test_the_ledger_password_never_shows(moto_endpoint: str) -> None:  # noqa: F811
    """An unreachable server is a clear error naming the ledger, without its password."""
    url = new_bucket_url(moto_endpoint, "o")
    ledger = "postgresql://batch:s3cr3t-pw@127.0.0.1:9/work?schema=summaries"
    result = invoke(["batch", "status", "--out", url, "--ledger", ledger])
    assert result.code != 0
    said = result.out + result.err
    assert "could not connect to the batch ledger postgresql://batch@127.0.0.1:9/work" in said
    assert "s3cr3t-pw" not in said


def test_a_transaction_left_open_by_ctrl_c_does_not_swallow_later_writes(
        shared: tuple[str, str]) -> None:
    """Ctrl-C inside psycopg's ``transaction().__enter__``, after BEGIN, leaves the ledger's
    one connection in a transaction; the next ``transaction()`` would then only open a
    savepoint and nothing would ever commit. The ledger rolls the leftover back first."""
    from chatstate.batch.pgledger import PgLedger

    ledger_url, _ = shared
    db = PgLedger(ledger_url, lease=0.5)
    try:
        db._db.execute("BEGIN")  # the state an interrupted __enter__ leaves behind
        db.register([("after-ctrl-c", "text", "sha", "after-ctrl-c.txt")])
        seen = query(ledger_url, "SELECT id FROM chatstate_batch.records "
                     "WHERE id='after-ctrl-c'")  # another connection: committed
        assert seen == [("after-ctrl-c",)]
    finally:
        db.close()
