"""The driver side of the JSON-lines protocol: standalone, stdlib only.

Drivers run as scripts (``python bench/drv_x.py``) in the project venv or in
``bench/.venv``, so they import nothing from the bench package. Answers go to
the original stdout; anything a library prints lands on stderr instead.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

Handler = Callable[..., dict[str, Any]]


def serve(handlers: dict[str, Handler]) -> None:
    """Answer one JSON command per stdin line until ``quit`` or EOF."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a library that prints must not corrupt the protocol
    sys.stdout = sys.stderr
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            out.write(json.dumps({"ok": True}) + "\n")
            return
        try:
            answer = handlers[op](**command)
        except Exception as exc:  # reported to the orchestrator, which stops the run
            traceback.print_exc()
            answer = {"error": f"{op}: {type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")


def text(i: int, size: int = 500) -> str:
    """About ``size`` bytes of plain prose, different for every ``i``."""
    words = ("the", "transcript", "is", "the", "state", "and", "the", "model", "is",
             "stateless", "so", "every", "turn", "must", "survive", "a", "crash")
    out = f"message {i}:"
    k = i
    while len(out) < size:
        k = (k * 1103515245 + 12345) & 0x7FFFFFFF
        out += " " + words[k % len(words)]
    return out[:size]
