"""Rendering model text safely on a terminal.

A reply is stored exactly as the model sent it, but printed with terminal
control sequences neutralised: ESC, other C0/C1 controls, DEL, lone carriage
returns and the Unicode bidi overrides become visible escapes, so a reply
cannot move the cursor, retitle the terminal, rewrite a line, or reorder or
hide text. Newlines and tabs stay; a CRLF line ending prints as a newline.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch == "\r\n":
        return "\n"
    if ch == "\x1b":
        return "^["
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def neutralise(text: str) -> str:
    """Make control characters visible; keep newlines and tabs."""
    return _CONTROL.sub(_escape, text)


CLIP = 600  # characters of a message shown in a listing before it is clipped


def clip(text: str, whole: str, limit: int = CLIP) -> str:
    """``text``, or its start and end with how much was left out and where to see it all."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-limit // 3:]
    return (f"{head} … [{len(text) - len(head) - len(tail)} more characters: `{whole}` "
            f"shows all] … {tail}")
