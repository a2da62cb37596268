"""``chatstate doctor`` through the real entry point, against both local stores."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from chatstate.cli import cli
from chatstate.core.transcript import Conversation, Message
from chatstate.ops.doctor import history_path, redact_url, scrub
from chatstate.stores import open_store

CANARIES = {"OPENAI_API_KEY": "sk-canary-123", "AWS_SECRET_ACCESS_KEY": "canary-aws-secret",
            "CHATSTATE_API_KEY": "sk-canary-456"}


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME (and so the REPL history path) inside the test's own directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_STATE_HOME", "XDG_DATA_HOME", "CHATSTATE_STORE", "DEPLOY_ID",
                 "CHATSTATE_ALLOW_EPHEMERAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def doctor(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, "doctor", *args])


def add_conversation(url: str, cid: str, turns: int = 1) -> None:
    store = open_store(url)
    try:
        store.create(Conversation(id=cid))
        prev = None
        batch = []
        for n in range(turns):
            for role, text in (("user", f"hi {n}"), ("assistant", f"hello {n}")):
                prev = Message.seal(prev, role=role, content=text, turn_id=f"t{n}")
                batch.append(prev)
        store.append(cid, batch)
    finally:
        store.close()


def tamper(url: str, cid: str) -> None:
    """Change the content of the first message behind the store's back."""
    path = Path(url.split("://", 1)[1])
    if url.startswith("json://"):
        file = path / f"{cid}.json"
        file.write_text(file.read_text().replace('"hi 0"', '"hi 0, edited"'))
    else:
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE messages SET body=replace(body, 'hi 0', 'hi 0, edited') "
                       "WHERE conversation_id=?", (cid,))
        db.close()


def test_ready_on_a_fresh_store(local_store_url: str) -> None:
    result = doctor(local_store_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("READY")
    assert "0 checked: all load and verify" in result.stdout
    assert "durable" in result.stdout
    assert result.stderr.startswith(f"store {local_store_url} on ")  # the one stderr line


def test_ready_on_every_store_kind(store_url: str) -> None:
    result = doctor(store_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("READY")
    if store_url.startswith("s3://"):
        assert "its durability is the service's own promise" in result.stdout
        data = json.loads(doctor(store_url, "--json").stdout)
        assert data["state"][0]["verdict"] == "durable"
        assert data["state"][0]["where"] == redact_url(store_url)


def test_ready_with_conversations(local_store_url: str) -> None:
    add_conversation(local_store_url, "a", turns=2)
    add_conversation(local_store_url, "b")
    result = doctor(local_store_url)
    assert result.exit_code == 0, result.output
    assert "2 checked: all load and verify" in result.stdout


def test_tampered_transcript_is_named_and_not_ready(local_store_url: str) -> None:
    add_conversation(local_store_url, "good")
    add_conversation(local_store_url, "victim", turns=2)
    tamper(local_store_url, "victim")
    result = doctor(local_store_url)
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("NOT READY")
    assert "conversation 'victim' does not load" in result.stdout
    assert "'good'" not in result.stdout
    data = json.loads(doctor(local_store_url, "--json").stdout)
    assert data["ready"] is False
    assert [f["id"] for f in data["conversations"]["failures"]] == ["victim"]
    assert "seq 0" in data["conversations"]["failures"][0]["error"]


def test_exit_code_through_the_installed_command(local_store_url: str, tmp_path: Path) -> None:
    add_conversation(local_store_url, "victim")
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    ok = subprocess.run([sys.executable, "-m", "chatstate", "--store", local_store_url,
                         "doctor"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    tamper(local_store_url, "victim")
    bad = subprocess.run([sys.executable, "-m", "chatstate", "--store", local_store_url,
                          "doctor"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "victim" in bad.stdout


def test_json_is_one_object_with_every_part(local_store_url: str) -> None:
    add_conversation(local_store_url, "a")
    result = doctor(local_store_url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ready"] is True
    assert data["problems"] == []
    assert data["store"] == local_store_url
    assert data["check"]["ok"] is True
    assert len(data["check"]["steps"]) == 3
    assert data["conversations"]["checked"] == 1
    assert data["durability"]["verdict"] == "durable"
    assert data["survived"]["opens"] >= 2  # add_conversation's open and doctor's
    assert data["host"]["boot_id"] == data["survived"]["boot_ids"][-1]
    rows = {row["what"]: row for row in data["state"]}
    assert list(rows) == ["transcripts", "in-progress replies", "REPL input history",
                          "batch ledger and outputs", "secrets", "logs"]
    assert rows["REPL input history"]["where"] == str(history_path())
    assert rows["transcripts"]["verdict"] == "durable"
    assert "chatstate batch status" in rows["batch ledger and outputs"]["where"]
    assert rows["secrets"]["verdict"] == "never stored"
    assert rows["logs"]["where"] == "stderr only"


def test_survived_reboots_deploys_and_hosts(local_store_url: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(local_store_url)
    for boot, deploy, host in (("boot-old-1", "d-1", "web-1"), ("boot-old-2", "d-2", "web-2")):
        store.record_open({"boot_id": boot, "deploy_id": deploy, "hostname": host,
                           "opened_at": "2020-01-01T00:00:00+00:00"})
    store.close()
    monkeypatch.setenv("DEPLOY_ID", "d-3")
    data = json.loads(doctor(local_store_url, "--json").stdout)
    survived = data["survived"]
    assert survived["reboots"] == 2  # three distinct boot ids
    assert survived["deploy_ids"] == ["d-1", "d-2", "d-3"]
    assert {"web-1", "web-2"} <= set(survived["hostnames"])
    assert data["host"]["deploy_id"] == "d-3"
    text = doctor(local_store_url).stdout
    assert "2 reboots, 3 deploys (d-1, d-2, d-3)" in text
    assert "DEPLOY_ID d-3" in text


def test_limit_bounds_the_conversations_loaded(local_store_url: str) -> None:
    for cid in ("a", "b", "c"):
        add_conversation(local_store_url, cid)
    data = json.loads(doctor(local_store_url, "--json", "--limit", "2").stdout)
    assert data["conversations"]["checked"] == 2
    assert data["conversations"]["more"] is True
    assert "--limit to check more" in doctor(local_store_url, "--limit", "2").stdout


@pytest.mark.invariant(7)
def test_interrupted_turn_is_reported_not_a_failure(local_store_url: str) -> None:
    store = open_store(local_store_url)
    store.create(Conversation(id="cut"))
    store.append("cut", [Message.seal(None, role="user", content="hi", turn_id="t1")])
    store.close()
    result = doctor(local_store_url)
    assert result.exit_code == 0, result.output
    assert "1 with an interrupted turn" in result.stdout


@pytest.mark.invariant(8)
def test_refused_store_is_not_ready_and_still_shows_the_table(tmp_path: Path) -> None:
    url = f"sqlite:///dev/shm/chatstate-doctor-test-{os.getpid()}/never.db"
    result = doctor(url)
    assert result.exit_code == 1, result.output
    assert "the store did not open" in result.stdout
    assert "REPL input history" in result.stdout
    assert not Path(url[len("sqlite://"):]).parent.exists()  # refused before any write
    data = json.loads(doctor(url, "--json").stdout)
    assert data["ready"] is False
    assert data["state"][0]["verdict"] == "ephemeral"


@pytest.mark.invariant(9)
def test_no_secret_in_any_output(local_store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    add_conversation(local_store_url, "a")
    outputs = [doctor(local_store_url), doctor(local_store_url, "--json")]
    tamper(local_store_url, "a")
    outputs.append(doctor(local_store_url))
    for result in outputs:
        for value in CANARIES.values():
            assert value not in result.output
            assert "canary" not in result.output


def test_redaction_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-canary-789")
    url = ("s3://AKIA:secretpw@bucket/prefix?endpoint_url=http://127.0.0.1:9000"
           "&aws_secret_access_key=zzz&region=eu-west-1")
    shown = redact_url(url)
    assert "secretpw" not in shown
    assert "AKIA" not in shown
    assert "zzz" not in shown
    assert "endpoint_url=http://127.0.0.1:9000" in shown
    assert "region=eu-west-1" in shown
    assert redact_url("sqlite:///a/b.db") == "sqlite:///a/b.db"
    assert scrub("error at tok-canary-789 end") == "error at [redacted] end"


def test_history_path_is_in_the_user_state_dir(isolated_home: Path) -> None:
    path = history_path()
    assert path.name == "history"
    assert str(path).startswith(str(isolated_home))
    assert "chatstate" in path.parts
