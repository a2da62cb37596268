"""`chatstate drill --json` run in this process, and what a clean result must say."""

from __future__ import annotations

from typing import Any

from support.cli_helpers import invoke


def drill(url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    result = invoke(["drill", "--store", url, "--json", *args], env=env)
    try:
        doc = result.json()
    except ValueError:
        raise AssertionError(f"no JSON (exit {result.code}): {result.out}\n{result.err}") \
            from None
    return result.code, doc, result.err


def assert_clean(doc: dict[str, Any], trials: int) -> None:
    assert doc["problems"] == [], doc["problems"]
    assert doc["problem_count"] == 0, doc["problems"]
    assert (doc["lost"], doc["corrupt"], doc["duplicated"]) == (0, 0, 0), doc
    assert doc["ok"] is True
    assert doc["trials"] == trials
    assert sum(doc["kills"].values()) == trials, doc["kills"]
    assert doc["acked"] > 0, doc
    assert doc["recovered"] > 0, doc
