"""A read-only web view of the store: browse, search and verify conversations.

``chatstate web`` serves the local store on loopback; ``chatstate serve`` mounts the
same pages at ``/ui`` behind its client tokens, where a token sees only its own
namespace's conversations. Server-rendered (Jinja2, autoescaped), no script at all,
under a strict Content-Security-Policy; only GET and HEAD are answered. Needs the
``web`` extra (``pip install 'chatstate[web]'``): nothing in the core imports it.
See docs/web.md.
"""

from __future__ import annotations

from chatstate.web._app import WebConfig, create_app

__all__ = ["WebConfig", "create_app"]
