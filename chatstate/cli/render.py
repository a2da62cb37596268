"""Rendering model text safely on a terminal.

A reply is stored exactly as the model sent it, but printed with terminal
control sequences neutralised: ESC, other C0/C1 controls, DEL and carriage
returns become visible escapes, so a reply cannot move the cursor, retitle the
terminal, rewrite a line or hide text.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    return "^[" if ch == "\x1b" else f"\\x{ord(ch):02x}"


def neutralise(text: str) -> str:
    """Make control characters visible; keep newlines and tabs."""
    return _CONTROL.sub(_escape, text)
