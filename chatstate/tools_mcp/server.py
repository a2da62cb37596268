"""One MCP server, run by the official SDK on a background event loop.

The SDK is async and the tool loop is not, so every server of a process lives
on one event-loop thread (``_Loop``). A server's transport and session are
async context managers that must be entered and left by one task, so each
server has a holder task that opens them, lists the tools, and then waits for
its stop event; calls are made from other tasks of the same loop and waited
for from the caller's thread with a timeout.

Failures are ``McpServerError`` with one line saying which server and what
happened: it failed to start (with the last line it wrote on stderr), it went
away during a call (crashed), or the call took longer than its timeout (the
request is cancelled and the server stopped: one that hangs in a call may hang
in every next one). A server that went away or was stopped is started again by
the next call. The SDK's exceptions are translated here, once.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import tempfile
import threading
import weakref
from typing import IO, Any

from chatstate.errors import McpServerError
from chatstate.tools_mcp.config import ServerConfig

__all__ = ["META_CALL_ID", "McpServer", "McpServerError"]

META_CALL_ID = "chatstate/tool_call_id"


class _Loop:
    """The process's one event-loop thread for MCP sessions, started when first needed."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="chatstate-mcp",
                                 daemon=True).start()
                cls._loop = loop
            return cls._loop


_live: weakref.WeakSet[McpServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """At exit (also after Ctrl-C): stop every server still running, so none is left."""
    for server in list(_live):
        server.stop()


class McpServer:
    """A configured server: ``start()`` (idempotent) lists its tools, ``call`` runs one."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.tools: list[dict[str, Any]] = []
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._holder: concurrent.futures.Future[None] | None = None
        self._errlog: IO[str] | None = None
        self._lock = threading.Lock()
        self._mark = 0

    @property
    def running(self) -> bool:
        return self._session is not None and self._holder is not None and \
            not self._holder.done()

    def start(self) -> list[dict[str, Any]]:
        """Start the server (once) and return its tools as wire JSON; McpServerError if not."""
        with self._lock:
            if self.running:
                return self.tools
            self._cleanup()
            self._mark = 0
            loop = _Loop.get()
            ready: concurrent.futures.Future[list[dict[str, Any]]] = concurrent.futures.Future()
            self._holder = asyncio.run_coroutine_threadsafe(self._hold(ready), loop)
            _live.add(self)
            try:
                self.tools = ready.result(timeout=self.config.start_timeout)
            except concurrent.futures.TimeoutError:
                self._cancel()
                raise self._error(f"did not start within {self.config.start_timeout:g} s "
                                  "(startTimeout)") from None
            except McpServerError:
                self._cancel()
                raise
            return self.tools

    def call(self, name: str, arguments: dict[str, Any],
             call_id: str | None = None) -> dict[str, Any]:
        """Call tool ``name``; its ``CallToolResult`` as wire JSON. McpServerError on failure.

        ``call_id`` (the model's tool call id) goes in the request's ``_meta`` as
        ``chatstate/tool_call_id``: a server can use it to notice a repeated call."""
        self.start()
        session, timeout = self._session, self.config.timeout
        self._mark = self._stderr_size()  # a failure quotes what it wrote from here on
        future = asyncio.run_coroutine_threadsafe(self._call(session, name, arguments, call_id),
                                                  _Loop.get())
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            # a server that hangs in one call may hang in the next: it is stopped, and the
            # next call starts it afresh
            with self._lock:
                self._cancel(wait=False)
            raise self._error(f"tool {name} did not answer within {timeout:g} s (timeout); "
                              "the call was cancelled and the server stopped", stderr=False,
                              outcome_unknown=True) from None
        except BaseException:  # Ctrl-C: the request is cancelled, not left running
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the server and wait (a few seconds at most) until it has exited."""
        with self._lock:
            self._cancel()

    # -- the event loop's side --------------------------------------------------------
    async def _hold(self, ready: concurrent.futures.Future[list[dict[str, Any]]]) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools = await _list_tools(session)
                self._session = session
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:  # the SDK's errors come out as exception groups too
            if not ready.done():
                ready.set_exception(self._error(f"failed to start: {_reason(exc)}"))
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self._session = None

    def _transport(self) -> Any:
        cfg = self.config
        if cfg.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            # its stderr, kept for the one line a failure quotes (closed in _cleanup)
            self._errlog = tempfile.TemporaryFile(  # noqa: SIM115
                "w+", encoding="utf-8", errors="replace")
            params = StdioServerParameters(command=cfg.command, args=list(cfg.args),
                                           env=cfg.env or None, cwd=cfg.cwd)
            return stdio_client(params, errlog=self._errlog)
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        client = create_mcp_http_client(headers=dict(cfg.headers))
        return streamable_http_client(str(cfg.url), http_client=client)

    async def _call(self, session: Any, name: str, arguments: dict[str, Any],
                    call_id: str | None) -> dict[str, Any]:
        if session is None:
            raise self._error("is not running")
        meta = {META_CALL_ID: call_id} if call_id else None
        try:
            result = await session.call_tool(name, arguments, meta=meta)
        except Exception as exc:
            from mcp.types import CONNECTION_CLOSED

            if getattr(exc, "code", None) != CONNECTION_CLOSED and self._session is session:
                raise self._error(f"refused the call to {name}: {_reason(exc)}",
                                  stderr=False) from None
            # the server went away (crashed, or was killed): the next call starts it again
            self._session = None
            if self._stop is not None:
                self._stop.set()
            raise self._error(f"went away during the call to {name}: {_reason(exc)}",
                              outcome_unknown=True) from None
        dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True,
                                                   exclude_none=True)
        return dumped

    # -- helpers ----------------------------------------------------------------------
    def _cancel(self, *, wait: bool = True) -> None:
        """Stop the holder: gracefully (``wait``) or by cancelling it, which still stops
        the server process (the SDK's transport shields its shutdown)."""
        holder, stop = self._holder, self._stop
        if holder is not None and not holder.done():
            loop = _Loop.get()
            if wait and stop is not None and self._session is not None:
                loop.call_soon_threadsafe(stop.set)
            else:  # still starting: cancelled (the transport still stops the process)
                holder.cancel()
            try:
                holder.result(timeout=5)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                holder.cancel()
            except Exception:  # a server failing on its way out is still out
                pass
        self._holder, self._session = None, None

    def _cleanup(self) -> None:
        self._cancel()
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    def _error(self, what: str, *, stderr: bool = True,
               outcome_unknown: bool = False) -> McpServerError:
        tail = self._stderr_tail() if stderr else ""
        more = f" (its stderr: {tail})" if tail else ""
        return McpServerError(f"MCP server {self.config.name!r} ({self.config.describe()}) "
                              f"{what}{more}", outcome_unknown=outcome_unknown)

    def _stderr_size(self) -> int:
        log = self._errlog
        try:
            return log.seek(0, 2) if log is not None and not log.closed else 0
        except (OSError, ValueError):
            return 0

    def _stderr_tail(self) -> str:
        log = self._errlog
        if log is None or log.closed:
            return ""
        try:
            log.seek(self._mark)
            lines = [line.strip() for line in log.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][:300] if lines else ""


async def _list_tools(session: Any) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        if cursor is None:
            page = await session.list_tools()
        else:
            from mcp.types import PaginatedRequestParams

            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                  for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            return tools


def _reason(exc: BaseException) -> str:
    """The innermost meaningful message of an (exception-group) error, in one line."""
    while getattr(exc, "exceptions", None):  # an exception group: its first member
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text
