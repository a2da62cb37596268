"""Who is asking, and may they: client tokens, namespaces, and the browser guards.

The security model (docs/serve.md, "Who can see what"):

- Each client token is a namespace. With ``--pass-client-key`` each upstream key the
  clients send is one. A conversation belongs to the namespace that created it
  (``metadata.namespace``); other namespaces can neither see nor write it. Without
  tokens (the loopback default) every client shares the one default namespace, which
  is also where conversations written by ``Chat``, the REPL or an older proxy live.
- A namespace id is a keyed digest (HMAC-SHA256) of the token or key, so neither is
  ever stored; the key is ``CHATSTATE_SERVE_NAMESPACE_KEY`` when set (then a stolen
  store gives no way to test guesses of a token offline), else a fixed one. Every
  proxy on one store needs the same key, and changing it hides what was stored.
- A web page can make a browser send requests to a loopback port. Two guards keep
  that from reaching the API: a POST must say ``Content-Type: application/json``
  (a cross-site page can send ``text/plain`` or a form without asking, never JSON),
  and the ``Host`` header must be an allowed name (loopback names, the bound host,
  ``--allow-host`` names) or an IP literal, which DNS rebinding cannot produce.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatstate.serve._errors import error_for
from chatstate.serve._wire import bearer

NAMESPACE_KEY_ENV = "CHATSTATE_SERVE_NAMESPACE_KEY"
_DEFAULT_KEY = b"chatstate-serve-namespace-v1"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def check_tokens(tokens: Iterable[str]) -> list[str]:
    """The tokens as given; ValueError naming the problem for a blank one (a token
    from an unset variable, ``--token ""``, would let no one in or everyone)."""
    out = list(tokens)
    for i, token in enumerate(out):
        if not token.strip():
            raise ValueError(f"client token {i + 1} is empty or blank (an unset variable?): "
                             "pass a non-blank --token, or leave tokens out on loopback")
        if any(c.isspace() for c in token):
            raise ValueError(f"client token {i + 1} contains whitespace, so no client can "
                             "send it in an Authorization header: remove the spaces")
    return out


def keyed_digest(kind: str, value: str, length: int = 32) -> str:
    """HMAC-SHA256 of ``kind:value`` under the namespace key, hex, ``length`` chars."""
    key = os.environ.get(NAMESPACE_KEY_ENV, "").encode() or _DEFAULT_KEY
    return hmac.new(key, f"{kind}:{value}".encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()[:length]


@dataclass
class Auth:
    """The client tokens and what a request's credentials make it."""

    tokens: list[str] = field(default_factory=list)
    pass_client_key: bool = False

    def namespace(self, request: Request) -> str | None:
        """The request's namespace ("" is the default one), or None: not authorized."""
        if self.tokens:
            # Anthropic clients send their key as x-api-key: it is the token as well
            given = request.headers.get("x-chatstate-token", "") if self.pass_client_key \
                else bearer(request.headers.get("authorization", "")) or \
                request.headers.get("x-api-key", "")
            if not any(hmac.compare_digest(given.encode(), t.encode()) for t in self.tokens):
                return None
            if not self.pass_client_key:
                return "t-" + keyed_digest("token", given)
        if self.pass_client_key:
            return "k-" + keyed_digest("key", bearer(request.headers.get("authorization", ""))
                                       or request.headers.get("x-api-key", ""))
        return ""


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Is ``host`` (a Host header, port and all) one the proxy answers?"""
    if "*" in allowed:
        return True
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True  # an IP literal: a rebinding page's Host is its own domain name
    except ValueError:
        pass
    return name in {h.strip("[]").lower() for h in (*LOOPBACK_NAMES, *allowed)}


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


class BrowserGuard:
    """ASGI middleware: a 421 for a Host not allowed, a 415 for a non-JSON POST body."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str] = ()) -> None:
        self.app = app
        self.allowed = list(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if not host_allowed(headers.get("host", ""), self.allowed):
            await _error(scope, send, 421, f"Host {headers.get('host', '')!r} is not one "
                         "this proxy answers (a guard against DNS rebinding): connect by IP "
                         "address, or start serve with --allow-host NAME",
                         "misdirected_request")
            return
        if scope["method"] in ("POST", "PUT", "PATCH") and \
                not _is_json(headers.get("content-type", "")):
            await _error(scope, send, 415, "the request body must be JSON: send "
                         "Content-Type: application/json (got "
                         f"{headers.get('content-type', 'none')!r})", "invalid_request_error")
            return
        await self.app(scope, receive, send)


async def _error(scope: Scope, send: Send, status: int, message: str, kind: str) -> None:
    response = error_for(str(scope.get("path", "")), status, message, kind)

    async def nothing() -> Message:  # the response reads no request
        return {"type": "http.disconnect"}

    await response(scope, nothing, send)
