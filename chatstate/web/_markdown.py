"""Markdown from the store as HTML that cannot run anything.

markdown-it-py (which rich already depends on) with raw HTML off: a ``<script>`` in a
message is text. Links and images keep only ``http``, ``https`` and ``mailto`` URLs
and relative ones (``javascript:``, ``data:``, ``vbscript:``, ``file:`` and every
other scheme are left as text). Fenced code is highlighted by pygments into
``class`` attributes only (the stylesheet colours them; the CSP allows no inline
style), and its text is escaped by pygments like everything else.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
SAFE_SCHEMES = ("http", "https", "mailto")
CSS_CLASS = "hl"


def safe_url(url: str) -> bool:
    """A link target the page may carry: a relative URL or an http(s)/mailto one."""
    cleaned = "".join(ch for ch in url if ch > " " and ch != "\x7f").strip()
    match = _SCHEME.match(cleaned)
    return match is None or match.group(1).lower() in SAFE_SCHEMES


@lru_cache(maxsize=64)
def _lexer(name: str) -> Any:
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(name)
    except ClassNotFound:
        return None


@lru_cache(maxsize=1)
def _formatter() -> Any:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(nowrap=True, classprefix=CSS_CLASS + "-")


def _highlight(code: str, lang: str, attrs: Any) -> str:
    from pygments import highlight

    lexer = _lexer(lang.strip().split()[0]) if lang.strip() else None
    if lexer is None:
        return ""  # markdown-it escapes it as plain code
    return f'<pre class="{CSS_CLASS}"><code>{highlight(code, lexer, _formatter())}</code></pre>'


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False,
                                   "highlight": _highlight})
    md.enable("table").enable("strikethrough")
    md.validateLink = safe_url  # type: ignore[method-assign]
    return md


def render(text: str) -> str:
    """``text`` (Markdown) as safe HTML."""
    return str(_parser().render(text))


def plain(text: str) -> str:
    """``text`` escaped, line breaks kept (for what is not Markdown: tool output)."""
    return html.escape(text)


def highlight_css() -> str:
    """The stylesheet rules for highlighted code (pygments' default style)."""
    from pygments.formatters import HtmlFormatter

    return str(HtmlFormatter(classprefix=CSS_CLASS + "-").get_style_defs(f".{CSS_CLASS}"))
