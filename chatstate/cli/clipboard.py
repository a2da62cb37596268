"""`/copy`: text to the clipboard, by the first way that exists here.

wl-copy (Wayland), xclip (X11) or pbcopy (macOS) when found on PATH and their
display is there; else the OSC 52 escape when stdout is a terminal (most
terminal emulators, tmux with set-clipboard, and over ssh); else none.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)


def last_code_block(text: str) -> str | None:
    """The body of the last fenced code block in ``text``; None when it has none."""
    blocks = _FENCE.findall(text)
    return blocks[-1][1] if blocks else None


def tools() -> list[tuple[str, list[str]]]:
    """The clipboard programs usable here, best first: (name, argv)."""
    found = []
    if os.environ.get("WAYLAND_DISPLAY") and shutil.which("wl-copy"):
        found.append(("wl-copy", ["wl-copy"]))
    if os.environ.get("DISPLAY") and shutil.which("xclip"):
        found.append(("xclip", ["xclip", "-selection", "clipboard"]))
    if sys.platform == "darwin" and shutil.which("pbcopy"):
        found.append(("pbcopy", ["pbcopy"]))
    return found


def copy(text: str) -> str | None:
    """Put ``text`` on the clipboard; the way used ("xclip", "OSC 52", ...) or None."""
    for name, argv in tools():
        try:
            subprocess.run(argv, input=text.encode("utf-8"), check=True, timeout=5,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        return name
    if sys.stdout.isatty():
        payload = base64.b64encode(text.encode("utf-8")).decode("ascii")
        sys.stdout.write(f"\x1b]52;c;{payload}\x07")
        sys.stdout.flush()
        return "OSC 52 (the terminal's clipboard escape)"
    return None
