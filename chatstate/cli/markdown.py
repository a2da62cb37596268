"""Printing a reply as it becomes durable: plain text, or Markdown on a terminal.

``ReplyPrinter`` gets only the deltas the session yields, and the session
yields a delta only once the store holds it, so nothing printed here is ever
ahead of the store. In Markdown mode the finished blocks of the reply (split
at blank lines outside code fences) are printed once, for good; the block
still growing is re-rendered in place (a rich ``Live`` region) as its text
grows. Every piece of model text is neutralised before rich sees it, so a
reply cannot smuggle control sequences through the renderer either.

rich is imported here only, and this module only when Markdown is on, so
`chatstate --help` and `ask` to a pipe never load it.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from chatstate.cli.render import neutralise

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def scan(text: str) -> tuple[int, str | None]:
    """(index where the last finished block ends, or 0; the opening line of an open fence).

    A block ends at a blank line outside a code fence, or where a fence closes.
    """
    end, fence, pos = 0, None, 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        marker = _FENCE.match(line)
        if marker and fence is None:
            fence = line
        elif marker and fence is not None and marker.group(1)[0] == fence.lstrip()[0]:
            fence = None
            end = pos if line.endswith("\n") else end
        elif fence is None and not line.strip() and line.endswith("\n") and pos > 1:
            end = pos
    return end, fence


def split_done(text: str) -> int:
    return scan(text)[0]


class ReplyPrinter:
    """Prints one reply's durable deltas; ``close`` (also on Ctrl-C) leaves the screen sane."""

    def __init__(self, *, markdown: bool, prefix: str = "") -> None:
        self.markdown = markdown
        self.tty = sys.stdout.isatty()
        self.text = ""
        self.started = time.monotonic()
        self._done = 0  # characters of self.text printed for good
        self._reopen = ""  # the fence line of a code block split because it was too tall
        self._live: Any = None
        self._printed = False  # a block is on screen: the next one gets a blank line first
        if markdown:
            from rich.console import Console

            self.console = Console(highlight=False, soft_wrap=False)
        self._prefix = "" if markdown else prefix  # written with the first text (after a
        #                                          "waiting" spinner has gone), or at close

    def feed(self, delta: str) -> None:
        if not delta:
            return
        self.text += delta
        if not self.markdown:
            sys.stdout.write(self._prefix + (neutralise(delta) if self.tty else delta))
            self._prefix = ""
            sys.stdout.flush()
            return
        cut = split_done(self.text)
        if cut > self._done:
            if self.text[self._done:cut].strip():  # blank lines only separate blocks
                self._commit(self._reopen + self.text[self._done:cut])
            self._done, self._reopen = cut, ""
        self._split_tall()
        if self.text[self._done:].strip():
            self._show(self._reopen + self.text[self._done:])

    def _split_tall(self) -> None:
        """A live region cannot redraw above the top of the screen: once the growing block
        nears half the screen, its finished lines are printed for good (a code block is
        closed there and reopened with the same fence). Half leaves room for wrapping."""
        pending = self._reopen + self.text[self._done:]
        if pending.count("\n") < max(self.console.size.height // 2, 4):
            return
        upto = self.text.rindex("\n") + 1
        if upto <= self._done:
            return
        fence = scan(self.text[:upto])[1]
        marker = _FENCE.match(fence) if fence else None
        self._commit(self._reopen + self.text[self._done:upto] + (marker.group(1) if marker
                                                                   else ""),
                     cut=marker is not None)
        self._done, self._reopen = upto, fence or ""

    def close(self) -> None:
        """End the reply: the growing block is printed as it stands, the cursor shown."""
        if not self.markdown:
            sys.stdout.write(self._prefix + "\n")
            sys.stdout.flush()
            return
        if self.text[self._done:].strip():
            self._commit(self._reopen + self.text[self._done:])

    def abort(self) -> None:
        """Ctrl-C or an error mid-reply: what is shown stays, the cursor comes back."""
        live, self._live = self._live, None
        if live is not None:
            live.stop()  # leaves the last render on screen and shows the cursor again

    def _view(self, block: str, *, cut: bool = False) -> Any:
        """The block rendered; a code block split because it was too tall loses the padding
        line rich puts at the split (its end, ``cut``; its start, when reopened), so the
        pieces join up as one block on screen and in what is copied from it."""
        from rich.markdown import Markdown

        view = Markdown(neutralise(block), code_theme="monokai")
        top = bool(self._reopen)
        return _Trimmed(view, top=top, bottom=cut) if top or cut else view

    def _show(self, block: str) -> None:
        """(Re-)render the growing block in place."""
        from rich.live import Live

        if self._live is not None:
            self._live.update(self._view(block), refresh=True)
            return
        if self._printed and not self._reopen:  # a blank line between blocks, as whole
            self.console.line()                  # Markdown renders; none in a split block
        self._printed = True
        self._live = Live(self._view(block), console=self.console, auto_refresh=False,
                          vertical_overflow="visible", redirect_stdout=False,
                          redirect_stderr=False)
        self._live.start(refresh=True)

    def _commit(self, block: str, *, cut: bool = False) -> None:
        """Print a finished block for good. Its live render (if any) is erased first, and
        the block printed plainly, so a block of any height is never redrawn in place."""
        live, self._live = self._live, None
        if live is not None:
            live.transient = True
            live.stop()
        elif self._printed and not self._reopen:
            self.console.line()
        self._printed = True
        self.console.print(self._view(block, cut=cut))

    def stats(self, usage: dict[str, int] | None) -> str | None:
        """"42 tokens · 118.3 tokens/s" when the provider reported usage, else None."""
        tokens = (usage or {}).get("completion_tokens")
        if not isinstance(tokens, int):
            return None
        spent = time.monotonic() - self.started  # from the request to the end of the reply
        speed = f" · {tokens / spent:.1f} tokens/s" if spent > 0 and tokens else ""
        return f"{tokens} tokens{speed}"


class _Trimmed:
    """A renderable minus its first line (``top``) and/or its last (``bottom``)."""

    def __init__(self, inner: Any, *, top: bool, bottom: bool) -> None:
        self.inner, self.top, self.bottom = inner, top, bottom

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        lines = console.render_lines(self.inner, options, pad=False)
        lines = lines[1 if self.top else 0:len(lines) - 1 if self.bottom else len(lines)]
        for line in lines:
            yield from line
            yield Segment.line()


def print_stats(line: str | None) -> None:
    """The dim line after a reply, on stderr (stdout carries only replies)."""
    if line:
        sys.stderr.write(f"\x1b[2m{line}\x1b[0m\n")
        sys.stderr.flush()


def print_markdown(text: str) -> None:
    """Render a whole stored text (replay, /history) as Markdown on stdout."""
    from rich.console import Console
    from rich.markdown import Markdown

    Console(highlight=False).print(Markdown(neutralise(text), code_theme="monokai"))
