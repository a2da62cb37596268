"""The proxy's endpoints besides the turns: models, health, readiness, the stored
conversations, metrics (``Probes``, a part of ``app.Proxy``)."""

from __future__ import annotations

from typing import Any

import httpx2
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chatstate.durable.guard import boot_id
from chatstate.serve._proxy_base import ProxyBase
from chatstate.serve._wire import (
    openai_error,
    passthrough,
)


class Probes(ProxyBase):
    """The endpoints that read, not write, a turn."""

    async def models(self, request: Request) -> Response:
        try:
            resp = await self._http().get(self.upstream + "/models",
                                          headers=self.upstream_headers(request))
        except httpx2.HTTPError as exc:
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error")
        return passthrough(resp, {})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "boot_id": boot_id(),
                             "durability": self._verdict()})

    async def readyz(self, request: Request) -> Response:
        report = await self.readiness.check()
        if self.config.tokens and self.namespace(request) is None:
            # no token, no details (the store's path, its probe, the pid): the status only
            ok = report.ok and (not self.config.ready_upstream
                                or (await self._upstream_ready(request))["ok"])
            return JSONResponse({"ready": ok}, status_code=200 if ok else 503)
        body: dict[str, Any] = {"ready": report.ok, "boot_id": boot_id(),
                                "store": {"durability": self._verdict(),
                                          "check": report.to_dict()}}
        if not report.ok:
            body["reason"] = f"store check failed: {report.error}"
        if self.config.ready_upstream:
            upstream = await self._upstream_ready(request)
            body["upstream"] = upstream
            if not upstream["ok"]:
                body["ready"] = False
                body.setdefault("reason", f"upstream not ready: {upstream['detail']}")
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    async def _upstream_ready(self, request: Request) -> dict[str, Any]:
        try:
            resp = await self._http().get(self.upstream + "/models", timeout=3.0,
                                          headers=self.upstream_headers(request))
        except httpx2.HTTPError as exc:
            return {"ok": False, "detail": f"unreachable ({type(exc).__name__})"}
        ok = resp.status_code < 400
        return {"ok": ok, "status": resp.status_code,
                "detail": "GET /models answered" if ok else f"HTTP {resp.status_code}"}

    def _verdict(self) -> str | None:
        report = getattr(self.config.store, "guard_report", None)
        return getattr(report, "verdict", None)

    async def conversations(self, request: Request) -> Response:
        return await self.listing.page(request)

    async def conversation(self, request: Request) -> Response:
        return await self.listing.one(request)

    async def metrics_text(self, request: Request) -> Response:
        content, media_type = self.metrics.render()
        return Response(content, headers={"Content-Type": media_type})

