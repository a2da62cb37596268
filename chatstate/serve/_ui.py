"""``/ui``: the read-only web view (``chatstate.web``) behind serve's tokens.

The caller's credentials are the API's: ``Authorization: Bearer TOKEN``, or what a
browser prompts for (HTTP Basic, the token as the password), and a token sees only
its own namespace's conversations. Without the ``web`` extra (Jinja2) ``/ui`` says
what to install.
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from chatstate.serve._auth import Auth, host_allowed
from chatstate.stores.base import Store


def ui_routes(store: Store, auth: Auth, allowed_hosts: list[str]) -> list[BaseRoute]:
    try:
        from chatstate.web import WebConfig, create_app
    except ModuleNotFoundError as exc:
        missing = exc.name

        async def absent(request: Request) -> Response:
            return PlainTextResponse(f"the web view needs the web extra ({missing} is "
                                     "missing): pip install 'chatstate[web]'", 404)

        return [Route("/ui", absent), Route("/ui/{rest:path}", absent)]
    config = WebConfig(store=store, namespace=auth.namespace,
                       host_allowed=functools.partial(host_allowed, allowed=allowed_hosts))
    return [Mount("/ui", create_app(config))]
