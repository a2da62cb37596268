"""A real OpenAI-compatible HTTP server on 127.0.0.1, scriptable, for tests, demos and drills.

    with FakeModel(reply_words=20) as fake:
        fake.fail_next(429, times=2, retry_after=1)
        adapter = make_adapter(base_url=fake.base_url)
        ...
        fake.request_log   # what arrived, and what the fake did about it

Endpoints: ``POST /v1/chat/completions`` (JSON, or SSE in OpenAI's chunk
format with a final usage chunk when ``stream_options.include_usage``),
``GET /v1/models``; and for a fake in another process ``POST
/_fake/control`` (``{"command": ..., "args": {...}}``), ``GET /_fake/log``,
``POST /_fake/reset`` (see ``FakeControl``). Stdlib only, so it starts fast;
it binds loopback only because it answers anyone without a key.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any, TextIO

from chatstate.testing._handler import FakeHTTPServer
from chatstate.testing._replies import reply_text
from chatstate.testing._script import Controls, Options, Script

__all__ = ["FakeModel", "main", "serve"]

LOOPBACK = ("127.0.0.1", "localhost")


class FakeModel(Controls):
    """The fake model server, run in a daemon thread. Use it as a context manager."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, latency: float = 0.0,
                 chunk_delay: float = 0.0, reply_words: int = 8,
                 model: str = "fake-model", context_window: int | None = None) -> None:
        if host not in LOOPBACK:
            raise ValueError(f"the fake model binds loopback only (127.0.0.1), not {host!r}")
        self.script = Script(Options(latency=latency, chunk_delay=chunk_delay,
                                     reply_words=reply_words, model=model,
                                     context_window=context_window))
        self._address = ("127.0.0.1", port)
        self._server: FakeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeModel:
        """Bind and serve in a daemon thread. Returns self."""
        if self._server is not None:
            return self
        server = FakeHTTPServer(self._address, self.script)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fake-model:{server.server_address[1]}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, wake hanging handlers and drop open connections. Idempotent."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        server.stop()
        thread.join(timeout=5)

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.base_url if self._server else "not started"
        return f"FakeModel({where})"

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake model is not running: use start() or `with`")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:PORT`` (control endpoints live here)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    def reply_for(self, messages: Sequence[dict[str, Any]], *,
                  max_tokens: int | None = None) -> str:
        """The reply this fake gives to ``messages`` with its current options."""
        return reply_text(messages, self.script.options.reply_words, max_tokens)

    def wait(self) -> None:
        """Block until the server stops (or KeyboardInterrupt)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def _command(self, command: str, args: dict[str, Any]) -> Any:
        return self.script.apply(command, args)


def serve(host: str = "127.0.0.1", port: int = 0, *, out: TextIO | None = None,
          **options: Any) -> None:
    """Run the fake in the foreground: print its base URL on one line, serve until Ctrl-C.

    ``options`` are FakeModel's: latency, chunk_delay, reply_words, model, context_window.
    """
    with FakeModel(host=host, port=port, **options) as fake:
        print(fake.base_url, file=out or sys.stdout, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            fake.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m chatstate.testing.fake_server --port 8089``"""
    parser = argparse.ArgumentParser(description="Run chatstate's fake OpenAI-compatible model.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--reply-words", type=int, default=8)
    parser.add_argument("--context-window", type=int, default=None,
                        help="answer 400 past this many prompt tokens")
    ns = parser.parse_args(argv)
    serve(port=ns.port, latency=ns.latency, chunk_delay=ns.chunk_delay,
          reply_words=ns.reply_words, context_window=ns.context_window)


if __name__ == "__main__":
    main()
