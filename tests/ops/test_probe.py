"""``chatstate probe`` and ``probe diff`` through the real entry point."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from chatstate.cli import cli
from chatstate.ops.probe import PROBE_DB, store_dir

CANARIES = {"OPENAI_API_KEY": "sk-canary-123", "AWS_SECRET_ACCESS_KEY": "canary-aws-secret"}


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """HOME, cwd and an extra directory of the test's own, and a store dir not yet made."""
    dirs = {name: tmp_path / name for name in ("home", "cwd", "extra")}
    for d in dirs.values():
        d.mkdir()
    monkeypatch.setenv("HOME", str(dirs["home"]))
    monkeypatch.chdir(dirs["cwd"])
    monkeypatch.delenv("CHATSTATE_STORE", raising=False)
    monkeypatch.setenv("DEPLOY_ID", "deploy-42")
    dirs["store"] = tmp_path / "store"
    return dirs


def probe(places: dict[str, Path], *args: str) -> Result:
    url = f"sqlite://{places['store']}/s.db"
    return CliRunner().invoke(cli, ["--store", url, "probe", *args])


def probe_json(places: dict[str, Path], *args: str) -> dict[str, Any]:
    result = probe(places, "--json", "--path", str(places["extra"]), *args)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def by_label(report: dict[str, Any], label: str) -> dict[str, Any]:
    return next(p for p in report["paths"] if label in p["labels"])


def test_json_has_the_fields(places: dict[str, Path]) -> None:
    data = probe_json(places)
    assert data["kind"] == "chatstate-probe"
    assert data["cwd"] == str(places["cwd"])
    assert data["deploy_id"] == "deploy-42"
    assert data["hostname"]
    assert data["time"]
    assert data["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    labels = [label for p in data["paths"] for label in p["labels"]]
    assert labels == ["/tmp", "$HOME", "cwd", "store", "--path"]
    for entry in data["paths"]:
        for key in ("path", "exists", "writable", "device", "fstype", "verdict", "reasons",
                    "sqlite"):
            assert key in entry, key
    extra = by_label(data, "--path")
    assert extra["exists"]
    assert extra["writable"]
    assert extra["verdict"] == "durable"
    assert extra["sqlite"]["rows_before"] == 0
    assert extra["sqlite"]["rows_after"] == 1
    assert by_label(data, "/tmp")["verdict"] == "ephemeral"


@pytest.mark.invariant(9)
def test_rows_accumulate_and_the_file_is_private(places: dict[str, Path]) -> None:
    probe_json(places)
    second = probe_json(places)
    assert by_label(second, "--path")["sqlite"]["rows_before"] == 1
    assert by_label(second, "--path")["sqlite"]["boots_before"] == 1
    mode = stat.S_IMODE(os.stat(places["extra"] / PROBE_DB).st_mode)
    assert mode == 0o600


def test_only_named_directories_are_written(places: dict[str, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """/tmp, $HOME and the cwd are inspected, not written: no row of this run lands in
    /tmp/.chatstate-probe.db (other programs may write that file meanwhile, so the check
    looks for this run's own DEPLOY_ID), and $HOME and the cwd stay empty."""
    mine = f"probe-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("DEPLOY_ID", mine)
    data = probe_json(places)
    probe(places)
    shared = Path("/tmp") / PROBE_DB
    if shared.exists():
        with contextlib.closing(sqlite3.connect(f"file:{shared}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT count(*) FROM runs WHERE deploy_id = ?", (mine,))
            assert rows.fetchone() == (0,)
    for label in ("/tmp", "$HOME", "cwd"):
        entry = by_label(data, label)
        assert entry["sqlite"]["file"] is None
        assert "not written" in entry["sqlite"]["error"]
        assert entry["write_probe"] is None, entry
    assert by_label(data, "$HOME")["writable"] is True  # the permission check alone
    assert list(places["home"].iterdir()) == []
    assert list(places["cwd"].iterdir()) == []
    extra = by_label(data, "--path")["sqlite"]
    assert extra["rows_after"] == 1
    with contextlib.closing(sqlite3.connect(extra["file"])) as db:  # the named one is written
        assert db.execute("SELECT deploy_id FROM runs").fetchall() == [(mine,)]


def test_same_directory_is_probed_once(places: dict[str, Path]) -> None:
    data = probe_json(places, "--path", str(places["cwd"]))
    cwd = by_label(data, "cwd")
    assert cwd["labels"] == ["cwd", "--path"]
    assert cwd["sqlite"]["rows_after"] == 1


def test_store_dir_from_the_url_without_opening_it() -> None:
    assert store_dir("sqlite:///var/lib/x/chatstate.db") == "/var/lib/x"
    assert store_dir("json:///srv/transcripts") == "/srv/transcripts"
    assert store_dir("s3://bucket/prefix?endpoint_url=http://x") is None


def test_text_output(places: dict[str, Path]) -> None:
    result = probe(places, "--path", str(places["extra"]))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "DEPLOY_ID  deploy-42" in out
    assert f"{places['extra']}  [--path]" in out
    assert "sqlite probe: 0 rows before this run (new file), 1 now" in out
    assert "verdict: durable" in out
    assert result.stderr == ""  # the probe does not open the store


def report(boot: str, *paths: dict[str, Any], host: str = "vm",
           time: str = "2026-01-01T10:00:00+00:00") -> dict[str, Any]:
    return {"kind": "chatstate-probe", "version": 1, "time": time, "boot_id": boot,
            "hostname": host, "deploy_id": None, "cwd": "/", "paths": list(paths)}


def place(path: str, *, before: int, after: int, existed: bool = True,
          device: str = "8:1") -> dict[str, Any]:
    return {"path": path, "labels": ["--path"], "exists": True, "writable": True,
            "device": device, "fstype": "ext4", "verdict": "durable", "reasons": [],
            "sqlite": {"rows_before": before, "rows_after": after, "existed": existed}}


def diff(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> Result:
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    return CliRunner().invoke(cli, ["probe", "diff", str(fa), str(fb)])


def test_diff_explains_a_reboot_that_lost_rows(tmp_path: Path) -> None:
    a = report("boot-1", place("/tmp", before=2, after=3, device="0:40"),
               place("/data", before=4, after=5))
    b = report("boot-2", place("/tmp", before=0, after=1, existed=False, device="0:41"),
               place("/data", before=5, after=6), host="vm-2",
               time="2026-01-01T12:30:00+00:00")
    result = diff(tmp_path, a, b)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "rebooted (boot id changed): boot-1 -> boot-2" in out
    assert "hostname changed (vm -> vm-2)" in out
    assert "the second run was 2h 30m after the first" in out
    assert "/tmp (--path): lost its files/rows (3 rows before, 0 now); device changed " \
           "(0:40 -> 0:41)" in out
    assert "/data (--path): kept its rows (5 rows before, 5 now)" in out


def test_diff_without_a_reboot(tmp_path: Path) -> None:
    a = report("boot-1", place("/x", before=0, after=1), place("/gone", before=0, after=1))
    b = report("boot-1", place("/x", before=0, after=1, existed=True),
               place("/new", before=0, after=1))
    out = diff(tmp_path, a, b).stdout
    assert "not rebooted (same boot id boot-1)" in out
    assert "same hostname vm" in out
    assert "/x (--path): lost its rows (the file is there, empty) (1 row before, 0 now)" in out
    assert "/gone (--path): only probed in the first run" in out
    assert "/new (--path): only probed in the second run" in out


def test_diff_of_two_real_runs(places: dict[str, Path], tmp_path: Path) -> None:
    result = diff(tmp_path, probe_json(places), probe_json(places))
    assert result.exit_code == 0, result.output
    assert "not rebooted" in result.stdout
    assert f"{places['extra']} (--path): kept its rows (1 row before, 1 now)" in result.stdout


def test_diff_unreadable_inputs_exit_2(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report("b")))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    for name, message in (("missing.json", "cannot read"), ("broken.json", "not valid JSON"),
                          ("other.json", "not a chatstate probe report")):
        result = CliRunner().invoke(cli, ["probe", "diff", str(good), str(tmp_path / name)])
        assert result.exit_code == 2, result.output
        assert message in result.stderr
        assert "Traceback" not in result.output
    real = subprocess.run([sys.executable, "-m", "chatstate", "probe", "diff", str(good),
                           str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert real.returncode == 2
    assert "cannot read" in real.stderr


@pytest.mark.invariant(9)
def test_no_secret_in_any_output(places: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                 tmp_path: Path) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    a, b = probe_json(places), probe_json(places)
    outputs = [json.dumps(a), probe(places).output, diff(tmp_path, a, b).output]
    for out in outputs:
        assert "canary" not in out
