"""A turn's request sent upstream and its reply relayed back, plain or streamed, once the
request's messages are durable (``UpstreamTurns``, a part of ``app.Proxy``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from starlette.requests import Request
from starlette.responses import Response

from chatstate.core.redact import scrub
from chatstate.serve._headers import relayed_headers
from chatstate.serve._metrics import clock, first_chunk_timed
from chatstate.serve._offload import (
    JSON,
)
from chatstate.serve._proxy_base import ProxyBase
from chatstate.serve._relay import RelayResponse, StreamRelay, chat_holds, client_failure
from chatstate.serve._request_record import RESPONSE, outcome
from chatstate.serve._stream_check import event_stream
from chatstate.serve._turns import Turn, Writer
from chatstate.serve._wire import (
    bearer,
    passthrough,
    upstream_error,
)
from chatstate.serve._wires import CHAT, Wire

log = logging.getLogger("chatstate.serve")


@dataclass(frozen=True)
class Prepared:
    """A request checked and placed, before anything of it is written (``_prepare``)."""

    data: Any  # the request as parsed
    messages: list[dict[str, Any]]  # its messages in the stored form
    cid: str | None  # the conversation it names
    forward: dict[str, Any]  # the body to forward
    key: str  # what knows the same request again (``request_key``)
    target: str | None  # the stored conversation it continues (None: a new one)
    content: bytes  # ``forward`` encoded
    record: dict[str, Any]  # what it asked for, as stored (``request_record``)


class _TurnEnd:
    """Ends a turn once: its writer lease goes, then the next request on it may begin."""

    def __init__(self, writer: Writer, turn: Turn, release: Callable[[], None]) -> None:
        self.writer, self.turn, self.release = writer, turn, release
        self.done = False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await asyncio.to_thread(self.writer.end, self.turn)
        finally:
            self.release()


class UpstreamTurns(ProxyBase):
    """Forwarding a begun turn and committing its reply."""

    def _committed(self, turn: Turn, reply: Mapping[str, Any], namespace: str,
                   found: dict[str, Any]) -> Any:
        message = self.writer.commit(turn, {**reply, "params": {RESPONSE: found}})
        self.metrics.reply(reply, namespace)
        return message

    async def _plain(self, request: Request, turn: Turn, prepared: Prepared,
                     headers: dict[str, str], namespace: str, wire: Wire = CHAT) -> Response:
        """``prepared``: the request as ``_prepare`` read it (the body to forward, encoded)."""
        content, forward = prepared.content, prepared.forward
        openai_error = wire.error
        try:
            started = clock()
            resp = await self._http().post(self.upstream + wire.upstream_path,
                                           content=content, headers={
                                               **self.upstream_headers(request, wire), **JSON})
            self.metrics.upstream.labels("/v1" + wire.upstream_path).observe(clock() - started)
        except httpx2.HTTPError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error", headers=headers)
        if resp.status_code >= 400:
            stored, relayed = upstream_error(resp.content, resp.status_code, headers,
                                             resp.headers, self.config.api_key,
                                             bearer(request.headers.get("authorization", "")))
            await asyncio.to_thread(self.writer.note_failure, turn, resp.status_code, stored,
                                    outcome(resp.status_code, clock() - started, resp.headers))
            return relayed
        try:
            reply = wire.settle(wire.reply_fields(resp.json()), forward)
        except ValueError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc),
                                    outcome(resp.status_code, clock() - started, resp.headers))
            return openai_error(502, f"the upstream reply is not a {wire.name} reply: {exc}",
                                "upstream_error", headers=headers)
        await asyncio.to_thread(self._committed, turn, reply, namespace,
                                outcome(resp.status_code, clock() - started, resp.headers))
        return passthrough(resp, headers)

    async def _stream(self, request: Request, turn: Turn, prepared: Prepared,
                      headers: dict[str, str], end: _TurnEnd, namespace: str,
                      wire: Wire = CHAT) -> Response:
        """``prepared``: the request as ``_prepare`` read it (the body to forward, encoded)."""
        content, forward = prepared.content, prepared.forward
        openai_error = wire.error
        http = self._http()
        try:
            upstream_request = http.build_request(
                "POST", self.upstream + wire.upstream_path, content=content,
                headers={**self.upstream_headers(request, wire), **JSON,
                         "Accept": "text/event-stream"})
            started = clock()
            resp = await http.send(upstream_request, stream=True)
            self.metrics.upstream.labels("/v1" + wire.upstream_path).observe(clock() - started)
        except httpx2.HTTPError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            await end()
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error", headers=headers)
        if resp.status_code >= 400:
            try:
                content = await resp.aread()
            finally:
                await resp.aclose()
            stored, relayed = upstream_error(content, resp.status_code, headers,
                                             resp.headers, self.config.api_key,
                                             bearer(request.headers.get("authorization", "")))
            await asyncio.to_thread(self.writer.note_failure, turn, resp.status_code, stored,
                                    outcome(resp.status_code, clock() - started, resp.headers))
            await end()
            return relayed
        lines, problem = await event_stream(resp, self.config.api_key,
                                            bearer(request.headers.get("authorization", "")))
        if problem is not None:  # an HTML page, JSON, nothing: not a stream to relay
            await asyncio.to_thread(self.writer.note_failure, turn, 502, problem)
            await end()
            return openai_error(502, problem, "upstream_error", headers=headers)
        writer = self.writer
        relay = StreamRelay(
            lines,
            save_partial=lambda text, model: writer.save_partial(turn, text, model),
            commit=lambda reply: self._committed(
                turn, wire.settle(reply, forward), namespace,
                outcome(resp.status_code, clock() - started, resp.headers)),
            fail=lambda status, detail: writer.note_failure(
                turn, status, detail, outcome(status, clock() - started, resp.headers)),
            redact=lambda text: scrub(text, self.config.api_key, bearer(
                request.headers.get("authorization", "")), limit=None),
            decoder=wire.decoder() if wire.decoder else None, named=wire.named,
            holds=wire.holds or chat_holds, rewrite=wire.rewrite() if wire.rewrite else None,
            failures=wire.failures())

        async def cleanup() -> None:
            try:
                await resp.aclose()
                if turn.writer.lost is not None:  # another writer has it: write nothing
                    log.warning("serve: %s", turn.writer.lost)
                elif not relay.committed:  # the client went away, or the upstream did
                    await asyncio.to_thread(relay.save_now)
                    log.info("serve: %s: turn %s left as partial (%d chars)", turn.id,
                             turn.turn_id, relay.saved_chars)
                    if relay.failed is None:  # the upstream's failure is recorded already
                        await asyncio.to_thread(self.writer.note_failure, turn,
                                                *client_failure(relay))
            finally:
                await end()

        events = first_chunk_timed(relay.events(), request.state.started,
                                   self.metrics.first_chunk)
        return RelayResponse(events, cleanup,
                             headers={**relayed_headers(resp.headers), **headers},
                             media_type="text/event-stream")

