"""``chatstate survival write|verify`` through the real entry point."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from chatstate.cli import cli
from chatstate.ops.survival import FILE_NAME, digest

CANARIES = {"OPENAI_API_KEY": "sk-canary-123", "AWS_SECRET_ACCESS_KEY": "canary-aws-secret"}


def survival(*args: str) -> Result:
    return CliRunner().invoke(cli, ["survival", *args])


def lines(directory: Path) -> list[str]:
    return (directory / FILE_NAME).read_text().splitlines()


def test_verify_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = survival("verify", "--dir", str(tmp_path / "nothing"))
    assert result.exit_code == 2, result.output
    assert "no survival file at" in result.stderr


def test_write_then_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_ID", "d-7")
    d = tmp_path / "new" / "dir"
    first = survival("write", "--dir", str(d), "--note", "before the reboot")
    assert first.exit_code == 0, first.output
    assert "wrote seq 0" in first.stdout
    assert " on " in first.stderr
    assert ": durable" in first.stderr  # where the bytes land
    assert survival("write", "--dir", str(d)).exit_code == 0
    records = [json.loads(line) for line in lines(d)]
    assert [r["seq"] for r in records] == [0, 1]
    assert records[0]["note"] == "before the reboot"
    assert records[0]["deploy_id"] == "d-7"
    assert records[0]["boot_id"]
    assert records[0]["hostname"]
    assert records[0]["time"]
    assert all(r["sha256"] == digest(r) for r in records)
    assert stat.S_IMODE(os.stat(d / FILE_NAME).st_mode) == 0o600
    result = survival("verify", "--dir", str(d))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: 2 records from 1 boot and 1 DEPLOY_ID, last written ")


def test_tampered_record_is_named(tmp_path: Path) -> None:
    for note in ("one", "two", "three"):
        survival("write", "--dir", str(tmp_path), "--note", note)
    file = tmp_path / FILE_NAME
    file.write_text(file.read_text().replace('"two"', '"TWO"'))
    result = survival("verify", "--dir", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "MISMATCH line 2: sha256 mismatch for seq 1" in result.stdout
    assert "FAILED: 1 problem; intact: 2 records" in result.stdout


def test_a_missing_record_breaks_contiguity(tmp_path: Path) -> None:
    for _ in range(3):
        survival("write", "--dir", str(tmp_path))
    kept = lines(tmp_path)
    (tmp_path / FILE_NAME).write_text(kept[0] + "\n" + kept[2] + "\n")
    result = survival("verify", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert "line 2: seq 2, expected 1" in result.stdout


def test_torn_tail_is_kept_and_reported(tmp_path: Path) -> None:
    survival("write", "--dir", str(tmp_path))
    with open(tmp_path / FILE_NAME, "a") as fh:
        fh.write('{"seq": 1, "note": "cut sh')
    result = survival("verify", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert "line 2: torn last line" in result.stdout
    assert survival("write", "--dir", str(tmp_path)).exit_code == 0
    assert lines(tmp_path)[1] == '{"seq": 1, "note": "cut sh'  # never overwritten
    assert json.loads(lines(tmp_path)[2])["seq"] == 1
    result = survival("verify", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert "line 2: not valid JSON" in result.stdout


def test_empty_file_is_a_failure(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"")
    result = survival("verify", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert "is empty" in result.stdout


def test_exit_codes_through_the_installed_command(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "chatstate", "survival", *args,
                               "--dir", str(tmp_path)], capture_output=True, text=True)

    assert run("verify").returncode == 2
    assert run("write").returncode == 0
    assert run("verify").returncode == 0
    file = tmp_path / FILE_NAME
    file.write_text(file.read_text().replace('"seq": 0', '"seq": 5'))
    assert run("verify").returncode == 1


def test_concurrent_writers_get_distinct_contiguous_seqs(tmp_path: Path) -> None:
    code = ("import sys\nfrom chatstate.ops.survival import write\n"
            "for i in range(15):\n    write(sys.argv[1], note=f'w{i}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)]) for _ in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    result = survival("verify", "--dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "ok: 60 records" in result.stdout


@pytest.mark.invariant(9)
def test_no_secret_in_any_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    outputs = [survival("write", "--dir", str(tmp_path)), survival("verify", "--dir",
                                                                   str(tmp_path))]
    for result in outputs:
        assert "canary" not in result.output
    assert "canary" not in (tmp_path / FILE_NAME).read_text()
