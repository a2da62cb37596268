"""`chatstate ask` stays light: its import graph leaves out what it does not use.

The CLI runs in a subprocess against the fake model over real HTTP (a local
endpoint, not ``--model fake``), with a real sqlite store; at exit it lists
the heavy modules it loaded. openai is only for an SDK client, pydantic-settings
is not used at all, rich only renders in a terminal, prompt_toolkit only for the
REPL, pydantic only for a stored value the fast check does not pass (or a setting
that needs validating), chatstate.testing only for ``--model fake``, and the
encryption code (and the subprocess a key command runs in) only with a key
configured or an encrypted store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatstate import open_store
from chatstate.testing import FakeModel

FORBIDDEN = ("openai", "pydantic_settings", "rich", "chatstate.testing",
             "chatstate.adapter.settings",  # the settings model: only when a value needs it
             # the transcript's records and the API key need no pydantic on the way to a turn
             "pydantic", "pydantic_core", "prompt_toolkit",
             # a plain store without a key configured: no sealing code, no key command
             "chatstate.stores.sealed", "chatstate.stores.codec", "subprocess")
PROBE = f"""
import json, sys
FORBIDDEN = {FORBIDDEN!r}
from chatstate.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in sys.modules
                if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
print(json.dumps({{"code": code, "loaded": loaded}}), file=sys.stderr)
"""


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=3) as model:
        yield model


def run_cli(tmp_path: Path, *args: str) -> tuple[dict[str, object], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    env["CHATSTATE_STORE"] = f"sqlite://{tmp_path / 'ask.db'}"
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env, check=False)
    report: dict[str, object] = json.loads(out.stderr.strip().splitlines()[-1])
    return report, out.stdout


def test_ask_against_a_local_endpoint_imports_nothing_heavy(tmp_path: Path,
                                                            fake: FakeModel) -> None:
    report, stdout = run_cli(tmp_path, "ask", "--base-url", fake.base_url, "hello")
    assert report["code"] in (0, None), report
    assert stdout.startswith("Echo: hello")  # a real turn, stored and printed
    assert report["loaded"] == [], f"`chatstate ask` imported {report['loaded']}"


EXIT_PROBE = """
import atexit, gc, json, sys
# registered before main's own exit handler, so it runs after it (last in, first out)
atexit.register(lambda: print(json.dumps({"frozen": gc.get_freeze_count()}), file=sys.stderr))
from chatstate.cli import main
main(sys.argv[1:])
"""


def test_the_cli_skips_the_collection_at_exit_after_its_exit_handlers(tmp_path: Path,
                                                                     fake: FakeModel) -> None:
    """At exit the CLI freezes the collector (CPython's shutdown would walk every object
    start-up made) as its last exit handler: the turn is stored, its lease released (the
    next turn on the conversation goes straight through), and the handler that ran after
    it saw the objects frozen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    env["CHATSTATE_STORE"] = f"sqlite://{tmp_path / 'ask.db'}"
    outs = [subprocess.run([sys.executable, "-c", EXIT_PROBE, "ask", "--base-url",
                            fake.base_url, "--id", "exit-probe", word],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           env=env, check=False)
            for word in ("hello", "again")]
    for out, word in zip(outs, ("hello", "again"), strict=True):
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"Echo: {word}")
        frozen = json.loads(out.stderr.strip().splitlines()[-1])["frozen"]
        assert frozen > 1000, out.stderr
    report, stdout = run_cli(tmp_path, "replay", "exit-probe")
    assert report["code"] in (0, None), report
    assert "hello" in stdout and "again" in stdout


COLLECTOR_TOOL = """
import gc

AT_IMPORT = gc.isenabled()  # --functions files are imported before the chat opens


def collector() -> str:
    \"\"\"Whether the cyclic garbage collector was on at start-up and is on now.\"\"\"
    return f"start-up {AT_IMPORT}, turn {gc.isenabled()}"
"""


def test_start_up_runs_without_the_collector_and_the_turn_with_it(tmp_path: Path) -> None:
    """The collector is off while ask starts (imports make objects that live to exit) and
    on again once the conversation is open, for the turn and its tools."""
    (tmp_path / "fns.py").write_text(COLLECTOR_TOOL)
    report, _ = run_cli(tmp_path, "ask", "--model", "fake", "--functions",
                        str(tmp_path / "fns.py"), "collector({})")
    assert report["code"] in (0, None), report
    store = open_store(f"sqlite://{tmp_path / 'ask.db'}")
    try:
        (summary,) = store.list_conversations()
        results = [m.text for m in store.load(summary.id).messages if m.role == "tool"]
    finally:
        store.close()
    assert results == ["start-up False, turn True"]


def test_the_probe_sees_a_heavy_import_when_there_is_one(tmp_path: Path) -> None:
    """--model fake does import chatstate.testing: the check above can fail."""
    report, stdout = run_cli(tmp_path, "ask", "--model", "fake", "hello")
    assert report["code"] in (0, None)
    assert stdout.startswith("Echo: hello")
    loaded = report["loaded"]
    assert isinstance(loaded, list)
    assert "chatstate.testing" in loaded
