"""The OpenAI routes ``chatstate serve`` relays but does not store.

``POST /v1/embeddings``, ``POST /v1/completions`` (the legacy text completion, plain
or streamed), ``GET /v1/models/{id}`` and Anthropic's ``POST /v1/messages/count_tokens``
go to the upstream as the client sent them
(its body unparsed, the proxy's upstream key or, with ``--pass-client-key``, the
client's), and the upstream's answer comes back as it is, streamed at the client's
pace. Nothing is written to the store; the access log has a line for each, as for
every request. An upstream error body goes through the one redactor first.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx2
from starlette.requests import Request
from starlette.responses import Response

from chatstate.serve._errors import error_for
from chatstate.serve._relay import RelayResponse
from chatstate.serve._wire import bearer, kept_headers, read_body, upstream_error


class PassThrough:
    """Relays one unstored route; ``http`` and ``headers`` are the proxy's (its upstream
    client and the headers its upstream requests carry)."""

    def __init__(self, upstream: str, http: Callable[[], httpx2.AsyncClient],
                 headers: Callable[[Request], dict[str, str]], *, max_body: int,
                 api_key: str | None) -> None:
        self.upstream, self.http, self.headers = upstream, http, headers
        self.max_body, self.api_key = max_body, api_key

    async def embeddings(self, request: Request) -> Response:
        return await self.relay(request, "/embeddings")

    async def completions(self, request: Request) -> Response:
        return await self.relay(request, "/completions")

    async def count_tokens(self, request: Request) -> Response:
        return await self.relay(request, "/messages/count_tokens")

    async def model(self, request: Request) -> Response:
        return await self.relay(request, "/models/" + request.path_params["model_id"])

    async def relay(self, request: Request, path: str) -> Response:
        headers = self.headers(request)
        content = None
        if request.method == "POST":
            body = await read_body(request, self.max_body)
            if isinstance(body, Response):
                return body
            content = body
            headers["Content-Type"] = request.headers.get("content-type", "application/json")
        http = self.http()
        try:
            resp = await http.send(http.build_request(request.method, self.upstream + path,
                                                      content=content, headers=headers),
                                   stream=True)
        except httpx2.HTTPError as exc:
            return error_for(request.url.path, 502,
                             f"upstream unreachable: {type(exc).__name__}", "upstream_error")
        if resp.status_code >= 400:
            try:
                raw = await resp.aread()
            finally:
                await resp.aclose()
            _, relayed = upstream_error(raw, resp.status_code, {}, resp.headers, self.api_key,
                                        bearer(request.headers.get("authorization", "")))
            return relayed
        return RelayResponse(resp.aiter_bytes(), resp.aclose, status_code=resp.status_code,
                             headers=kept_headers(resp.headers))

