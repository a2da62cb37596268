"""The Markdown reply printer on its own: block splitting, tall code blocks, neutralising."""

from __future__ import annotations

import io

from rich.console import Console
from support.cli_helpers import HOSTILE, RAW_CONTROLS, strip_ansi

from chatstate.cli.markdown import ReplyPrinter, scan


def printer(height: int = 20) -> tuple[ReplyPrinter, io.StringIO]:
    out = io.StringIO()
    p = ReplyPrinter(markdown=True)
    p.console = Console(file=out, force_terminal=True, width=80, height=height,
                        highlight=False)
    return p, out


def test_blocks_end_at_blank_lines_outside_fences() -> None:
    assert scan("a\n\nb") == (3, None)
    assert scan("a\n\n```py\nx\n\ny") == (3, "```py\n")  # a blank line inside a fence
    assert scan("```py\nx\n```\nz") == (12, None)  # a closing fence ends its block
    assert scan("~~~\n```\n~~~\n") == (12, None)  # only the same fence character closes


def test_a_code_block_taller_than_the_screen_is_printed_in_pieces() -> None:
    """Live regions cannot redraw above the top of the screen, so a tall block is cut into
    screen-sized code blocks, each closed and reopened with the same fence."""
    p, out = printer(height=20)
    p.feed("Here:\n\n```python\n")
    for n in range(60):
        p.feed(f"print({n})\n")
    assert p._done > 0
    assert p._reopen == "```python\n"
    p.feed("```\n\nafter")
    p.close()
    shown = strip_ansi(out.getvalue())
    assert all(f"print({n})" in shown for n in range(60))
    assert "```" not in shown
    assert "after" in shown


def test_model_text_is_neutralised_before_rich_sees_it() -> None:
    p, out = printer()
    p.feed(f"**x** {HOSTILE}\n\nend")
    p.close()
    assert not any(c in out.getvalue() for c in RAW_CONTROLS)
    assert "^[]0;pwned" in strip_ansi(out.getvalue())
