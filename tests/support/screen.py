"""What a real terminal shows: a command run in a tmux pane, and the screen it leaves."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from support import tiers


def screen_of(command: str, tmp_path: Path, *, env: dict[str, str],
              during: Callable[[Callable[..., str]], None] | None = None,
              history: bool = False) -> str:
    """Run ``command`` in a 120x40 tmux pane; return the screen once it has finished.

    ``during(tmux)`` runs while it does: ``tmux("send-keys", ...)`` types into the pane,
    ``tmux("capture-pane", "-p")`` returns what it shows so far. ``history`` adds the lines
    scrolled off the top."""
    tiers.need("tmux", shutil.which("tmux") is not None, "tmux is not installed")
    # a socket path longer than 107 bytes cannot be bound (a deep scratch dir in CI):
    # a named server in tmux's own socket directory instead
    socket = f"chatstate-test-{os.getpid()}-{secrets.token_hex(4)}"
    done = tmp_path / "done"
    script = tmp_path / "run.sh"
    script.write_text(f"{command}; touch {done}; sleep 120\n")
    base = ["tmux", "-L", socket]
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}  # the pane's size

    def tmux(*args: str) -> str:
        return subprocess.run([*base, *args], capture_output=True, text=True,
                              check=True).stdout

    subprocess.run([*base, "new-session", "-d", "-x", "120", "-y", "40", "bash", str(script)],
                   env=env, check=True)
    try:
        if during is not None:
            during(tmux)
        for _ in range(600):
            if done.exists():
                break
            time.sleep(0.1)
        assert done.exists(), "the command did not finish within a minute"
        time.sleep(0.3)
        return tmux("capture-pane", "-p", "-J", *(["-S", "-"] if history else []))
    finally:
        subprocess.run([*base, "kill-server"], check=False, capture_output=True)


def wait_for(tmux: Callable[..., str], text: str) -> None:
    """Until the pane shows ``text`` (a minute at most)."""
    for _ in range(600):
        if text in tmux("capture-pane", "-p", "-J"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared:\n" + tmux("capture-pane", "-p", "-J"))
