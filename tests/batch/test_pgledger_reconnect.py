"""The PostgreSQL batch ledger rides out a server restart (issue 21 item 5).

Three worker processes share one ledger on a real PostgreSQL server. Mid-run
the server is SIGKILLed and restarted 1.5 s later on the same data directory
and port. The workers reconnect (re-checking the server's settings) and carry
on: every one exits 0 and every record is done, none left running.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.batch_child import PROMPT, spawn, write_jsonl
from support.cli_helpers import cli_env
from support.pgserver import PgServer, pg_server, start_server  # noqa: F401  (fixture)

from chatstate.testing import FakeModel

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed: "
                             "pip install 'chatstate[postgres]'")


@pytest.fixture
def shared_ledger(pg_server: PgServer) -> str:  # noqa: F811
    return pg_server.new_database()


def _statuses(url: str) -> dict[str, int]:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as db:
            rows = db.execute("SELECT status, count(*) FROM chatstate_batch.records "
                              "GROUP BY status").fetchall()
    except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
        return {}
    return {str(s): int(n) for s, n in rows}


def test_workers_ride_out_a_server_kill_and_restart(tmp_path: Path) -> None:
    server = start_server(tmp_path / "pg")
    try:
        ledger = server.new_database()
        source = tmp_path / "in.jsonl"
        ids = write_jsonl(source, 36)
        env = cli_env(tmp_path)
        with FakeModel(latency=0.3) as fake:
            args = ["batch", "run", str(source), "--prompt", PROMPT, "--out",
                    str(tmp_path / "out"), "--ledger", ledger, "--base-url", fake.base_url,
                    "--model", "fake-model", "-j", "2", "--lease", "10"]
            workers = [spawn([*args, "--host-id", f"host-{n}"], env) for n in range(3)]
            try:
                deadline = time.monotonic() + 30
                while _statuses(ledger).get("done", 0) < 6:
                    assert time.monotonic() < deadline, "the batch never got going"
                    assert all(w.poll() is None for w in workers), "a worker ended early"
                    time.sleep(0.05)
                server.kill9()
                time.sleep(1.5)
                server.start()
                results = [w.communicate(timeout=60) for w in workers]
            finally:
                for proc in workers:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
        for proc, (_, err) in zip(workers, results, strict=True):
            assert proc.returncode == 0, err[-2000:]
        assert _statuses(ledger) == {"done": len(ids)}
    finally:
        server.stop()


def test_a_terminated_session_is_reconnected_and_the_claim_not_repeated(
        shared_ledger: str) -> None:
    """An admin shutdown of the ledger's session: the next calls reconnect and carry on."""
    from chatstate.batch.pgledger import PgLedger

    db = PgLedger(shared_ledger, lease=5.0)
    try:
        db.register([("a", "text", "sha", "a.txt"), ("b", "text", "sha", "b.txt")])
        first = db.claim("host-a:1", 3, count=True)
        assert first is not None and first.id == "a"
        pid = db._db.info.backend_pid
        _terminate(shared_ledger, pid)
        assert db.finish("a", "host-a:1", "x")  # on a new session
        assert db._db.info.backend_pid != pid
        _terminate(shared_ledger, db._db.info.backend_pid)
        second = db.claim("host-a:1", 3, count=True)
        assert second is not None and second.id == "b" and second.attempts == 0
        assert db.counts() == {**db.counts(), "done": 1, "running": 1}
    finally:
        db.close()


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
