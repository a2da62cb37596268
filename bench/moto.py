"""A moto S3 server on 127.0.0.1 for the s3 store, started and stopped by the bench.

Same approach as tests/support/s3server.py (a ``moto_server`` subprocess, a bucket made
with a plain PUT), without pytest. moto keeps objects in memory: its "ack" is
the S3 contract being exercised, not a durable disk, so local fsync counts for
the s3 store are 0 by design.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import subprocess
import time
import uuid

from .common import PROJECT_PY, WORK


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(port: int, method: str, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(method, path, headers={"Content-Length": "0"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


class Moto:
    def __init__(self) -> None:
        self.port = _free_port()
        script = PROJECT_PY.with_name("moto_server")
        cmd = [str(script)] if script.exists() else [str(PROJECT_PY), "-m", "moto.server"]
        self.log = WORK / "moto.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if _status(self.port, "GET", "/") == 200:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto_server did not start; see {self.log}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def new_store_url(self, prefix: str = "bench") -> str:
        bucket = f"bench-{uuid.uuid4().hex[:16]}"
        if _status(self.port, "PUT", f"/{bucket}") != 200:
            raise RuntimeError(f"could not create bucket {bucket} on moto")
        return (f"s3://{bucket}/{prefix}?endpoint_url={self.endpoint}&region=us-east-1"
                "&allow_http=true")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Moto:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
