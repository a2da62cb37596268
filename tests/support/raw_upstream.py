"""An upstream on 127.0.0.1 that answers every POST with the same event stream, byte for
byte, in the reads it is given (each one sent and flushed on its own, a moment apart),
for tests of what a proxy makes of an upstream's exact bytes."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RawUpstream:
    def __init__(self, reads: Sequence[bytes], *, gap: float = 0.02) -> None:
        self.reads, self.gap = list(reads), gap
        self.bodies: list[bytes] = []  # the requests' bodies, as received
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                upstream.bodies.append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for read in upstream.reads:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(read), read))
                    self.wfile.flush()
                    time.sleep(upstream.gap)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> RawUpstream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
