"""The web view's guards, around every request: read-only, Host-checked, CSP-locked.

- Only ``GET`` and ``HEAD``: any other method is a 405, on every path (there is no
  write endpoint to reach).
- The ``Host`` header must be one the caller's predicate allows (``chatstate web``
  and ``serve`` pass serve's ``host_allowed``: loopback names, the bound host,
  ``--allow-host`` names, IP literals), against DNS rebinding: 421 otherwise.
- Every response carries a strict Content-Security-Policy (no script at all, styles
  and images from this origin only, no framing, no plugins), ``nosniff``, no
  referrer, and ``no-store`` (pages may hold private conversations). A response that
  set its own policy (a blob: ``sandbox``) keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = ("default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'; img-src 'self'; style-src 'self'")
BLOB_CSP = "sandbox; default-src 'none'; img-src 'self'; style-src 'none'; script-src 'none'"
HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
           (b"x-frame-options", b"DENY"), (b"cache-control", b"no-store"),
           (b"cross-origin-opener-policy", b"same-origin"),
           (b"cross-origin-resource-policy", b"same-origin")]


class Guard:
    def __init__(self, app: ASGIApp, host_allowed: Callable[[str], bool]) -> None:
        self.app = app
        self.host_allowed = host_allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope.get("headers", [])
                     if k.lower() == b"host"), "")
        if scope["method"] not in ("GET", "HEAD"):
            await _plain(send, 405, "the web view is read-only: only GET and HEAD",
                         [(b"allow", b"GET, HEAD")])
            return
        if not self.host_allowed(host):
            await _plain(send, 421, f"Host {host!r} is not one this server answers (a guard "
                         "against DNS rebinding): connect by IP address, or start it with "
                         "--allow-host NAME")
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", CSP.encode()))
                headers += [(k, v) for k, v in HEADERS if k not in names]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, secured)


async def _plain(send: Send, status: int, text: str,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"content-security-policy", CSP.encode()), *HEADERS,
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
