"""The floor for ``serve_load``: the same ASGI stack as ``chatstate serve`` (uvicorn,
Starlette, httpx2), relaying bytes to the upstream and back, storing nothing and
parsing nothing. What it adds to the upstream's latency is what any Python proxy on
this machine adds; what ``serve`` adds beyond it is chatstate's own cost.

    python bench/relay_floor.py --upstream http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import AsyncIterator

import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def app(upstream: str) -> Starlette:
    client = httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=1000))

    async def relay(request: Request) -> Response:
        body = await request.body()
        req = client.build_request("POST", f"{upstream}/chat/completions", content=body,
                                   headers={"content-type": "application/json"})
        resp = await client.send(req, stream=True)

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in resp.aiter_raw():
                yield chunk

        return StreamingResponse(chunks(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type"),
                                 background=BackgroundTask(resp.aclose))

    return Starlette(routes=[Route("/v1/chat/completions", relay, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # connections queue until uvicorn accepts
    print(f"serving on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(app(args.upstream.rstrip("/")), log_level="warning",
                            access_log=False, timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
