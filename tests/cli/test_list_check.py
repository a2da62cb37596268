"""`list --check` reads every transcript and flags the damaged, the interrupted and the cut."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli_helpers import cli_env, invoke


def test_list_check_flags_damaged_interrupted_and_cut(tmp_path: Path) -> None:
    store = f"json://{tmp_path}/s"
    env = cli_env(tmp_path)
    for cid in ("fine", "cut", "damaged"):
        done = invoke(["ask", "--model", "fake", "--id", cid, f"hello {cid}"], store=store,
                      env=env)
        assert done.code == 0, done.err
    cut = invoke(["ask", "--model", "fake", "--id", "cut", "--max-tokens", "1", "again"],
                 store=store, env=env)
    assert cut.code == 0, cut.err
    # a model that cannot be reached leaves the stored question without a reply
    lost = invoke(["ask", "--id", "asked", "--keep-failed", "--base-url",
                   "http://127.0.0.1:9/v1", "hello?"],
                  store=store, env={**env, "CHATSTATE_MAX_RETRIES": "0"})
    assert lost.code == 1, lost.err
    page = tmp_path / "s" / "damaged.json"
    before = page.read_bytes()
    page.write_bytes(before + b"garbage")

    plain = invoke(["list"], store=store, env=env)
    assert plain.code == 0 and "[" not in plain.out  # without --check: headers only

    checked = invoke(["list", "--check"], store=store, env=env)
    assert checked.code == 1
    flags = {line.split()[0]: line for line in checked.out.splitlines()}
    assert flags["cut"].endswith("[cut short]")
    assert flags["asked"].endswith("[interrupted]")
    assert flags["damaged"].endswith("[damaged]")
    assert "[" not in flags["fine"]
    assert "1 damaged conversation(s): damaged" in checked.err
    assert page.read_bytes() == before + b"garbage"  # looked at, never touched

    as_json = invoke(["list", "--check", "--json"], store=store, env=env)
    rows = {r["id"]: r["flags"] for r in json.loads(as_json.out)}
    assert rows == {"fine": [], "cut": ["cut short"], "asked": ["interrupted"],
                    "damaged": ["damaged"]}
