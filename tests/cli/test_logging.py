"""Logs go to stderr only, as text or JSON lines; retries are logged without secrets."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from chatstate import make_adapter
from chatstate.testing import FakeModel


def test_debug_json_logs_are_json_lines_on_stderr_and_stdout_is_the_reply(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "chatstate", "--log-format", "json", "--debug", "--store",
         f"sqlite://{tmp_path}/s.db", "ask", "--model", "fake", "--no-stream", "hi"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Echo: hi")
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    loggers = {r["logger"] for r in records}
    assert {"chatstate.stores", "chatstate.session"} <= loggers
    assert all(r["level"] in ("debug", "info", "warning", "error") for r in records)
    assert not any("chatstate." in line for line in done.stdout.splitlines())


@pytest.mark.invariant(9)
def test_a_retry_is_logged_with_its_status_not_the_providers_text(
        caplog: pytest.LogCaptureFixture) -> None:
    with FakeModel() as fake:
        fake.fail_next(429, retry_after=0.01, message="sk-echoed-canary")
        adapter = make_adapter(base_url=fake.base_url, api_key="sk-echoed-canary",
                               backoff_base=0.01)
        with caplog.at_level(logging.WARNING, logger="chatstate.adapter"):
            reply = adapter.complete([{"role": "user", "content": "hi"}])
    assert reply.text.startswith("Echo: hi")
    [record] = [r for r in caplog.records if r.name == "chatstate.adapter"]
    assert "attempt 1 failed (HTTP 429)" in record.getMessage()
    assert "canary" not in caplog.text
