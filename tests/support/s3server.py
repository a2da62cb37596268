"""A real moto S3 server on loopback for the tests, and a fault-injecting proxy for it.

Join a test module or conftest to the shared server with::

    from support.s3server import moto_endpoint, new_bucket_url  # moto_endpoint is a fixture

    def test_something(moto_endpoint):
        url = new_bucket_url(moto_endpoint)  # a fresh bucket: s3://cs-…/t?endpoint_url=…
        store = open_store(url)

``moto_server`` (session scope) starts one ``moto_server`` subprocess per
pytest process (each xdist worker has its own) and stops it at the end;
``moto_endpoint`` gives its endpoint to one test and sets dummy AWS credentials
in the environment for that test only, so they never leak into other tests. moto keeps
data in memory: tests must not rely on data surviving a restart of it. For
tests that stop the server, ``start_moto()`` gives a dedicated one.

``FaultProxy`` sits between the store and moto and answers chosen requests
with 500/503 (before or after forwarding them), and logs every request, so
tests can inject transient failures and count requests per operation; with
``strip=`` it drops request headers (a proxy that loses conditional writes).

``read_object``, ``write_object`` and ``object_keys`` give raw access to a
store's objects (keys relative to its prefix; the layout is in
``chatstate/stores/s3/store.py``) for tests that tamper with stored documents.

The module registers itself under its old names ``tests.s3server`` and ``s3server`` too, so
every import spelling shares one server.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

for _alias in ("tests.s3server", "s3server"):
    sys.modules.setdefault(_alias, sys.modules[__name__])

REGION = "us-east-1"
DUMMY_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_REGION": REGION}
CLEARED_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
               "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")

__all__ = ["FaultProxy", "MotoServer", "make_bucket", "moto_endpoint", "moto_server",
           "new_bucket_url",
           "object_keys", "read_object", "s3_url", "start_moto", "write_object"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _http(endpoint: str, method: str, path: str, timeout: float = 5.0) -> int:
    parts = urlsplit(endpoint)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request(method, path, headers={"Content-Length": "0"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@dataclass
class MotoServer:
    """One ``moto_server`` subprocess on 127.0.0.1."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(OSError):
            self.log.unlink()


def _command(port: int) -> list[str]:
    # moto behind a lock for writes: its conditional PUTs race otherwise (moto_atomic.py)
    return [sys.executable, str(Path(__file__).with_name("moto_atomic.py")), "-H", "127.0.0.1",
            "-p", str(port)]


def start_moto(timeout: float = 30.0) -> MotoServer:
    """Start a dedicated moto server and wait until it answers."""
    last = ""
    for _ in range(3):  # the free port may be taken between probe and bind
        port = free_port()
        fd, log_name = tempfile.mkstemp(prefix="moto-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(_command(port), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        server = MotoServer(port, proc, Path(log_name))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                if _http(server.endpoint, "GET", "/", timeout=1) == 200:
                    return server
            time.sleep(0.05)
        last = server.log.read_text(errors="replace")[-2000:]
        server.stop()
    raise RuntimeError(f"moto_server did not start: {last}")


def make_bucket(endpoint: str, name: str | None = None) -> str:
    name = name or f"cs-{uuid.uuid4().hex[:20]}"
    status = _http(endpoint, "PUT", f"/{name}")
    if status != 200:
        raise RuntimeError(f"could not create bucket {name} at {endpoint}: HTTP {status}")
    return name


def s3_url(endpoint: str, bucket: str, prefix: str = "t") -> str:
    path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
    return f"s3://{bucket}{path}?endpoint_url={endpoint}&region={REGION}&allow_http=true"


def new_bucket_url(endpoint: str, prefix: str = "t") -> str:
    """Create a fresh, uniquely named bucket and return its s3:// store URL."""
    return s3_url(endpoint, make_bucket(endpoint), prefix)


def read_object(url: str, key: str) -> bytes | None:
    """Raw bytes of ``key`` (relative to the store's prefix, e.g.
    ``conversations/c1/header.json``), or None. For tests that inspect or tamper."""
    from chatstate.stores.s3._transport import S3IO, parse_url

    blob = S3IO(parse_url(url)).get(key)
    return None if blob is None else blob.data


def write_object(url: str, key: str, data: bytes) -> None:
    """Overwrite ``key`` (relative to the store's prefix) with ``data``, unconditionally."""
    from chatstate.stores.s3._transport import S3IO, parse_url

    S3IO(parse_url(url)).put(key, data)


def object_keys(url: str, prefix: str = "conversations") -> list[str]:
    """Every key under the path segment ``prefix`` of the store, sorted."""
    from chatstate.stores.s3._transport import S3IO, parse_url

    return [k for k, _ in S3IO(parse_url(url)).keys(prefix)]


class _Shared:
    """The one server of this process, shared by every fixture that imports it."""

    lock = threading.Lock()
    server: MotoServer | None = None
    users = 0


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of this process's moto S3 server; it touches no env."""
    with _Shared.lock:
        if _Shared.server is None or _Shared.server.proc.poll() is not None:
            _Shared.server = start_moto()
        _Shared.users += 1
        endpoint = _Shared.server.endpoint
    try:
        yield endpoint
    finally:
        with _Shared.lock:
            _Shared.users -= 1
            if _Shared.users == 0 and _Shared.server is not None:
                _Shared.server.stop()
                _Shared.server = None


@pytest.fixture
def moto_endpoint(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The moto server's endpoint, with dummy AWS credentials set for this test only."""
    for key in CLEARED_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in DUMMY_ENV.items():
        monkeypatch.setenv(key, value)
    return moto_server


@dataclass
class _Rule:
    status: int
    times: int
    match: Callable[[str, str], bool]
    after_forward: bool


@dataclass
class FaultProxy:
    """A reverse proxy in front of moto that can fail chosen requests. Logs every request."""

    upstream: str
    log: list[tuple[str, str, int]] = field(default_factory=list)
    rules: list[_Rule] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    conns: list[socket.socket] = field(default_factory=list)
    stopped: bool = False
    strip: tuple[str, ...] = ()
    """Request headers dropped on the way upstream (``("If-None-Match", "If-Match")``: a
    proxy that silently turns conditional writes into plain ones)."""

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail(self, status: int, times: int = 1, *, method: str | None = None,
             path_contains: str = "", after_forward: bool = False) -> None:
        """Answer the next ``times`` matching requests with ``status``.

        ``after_forward`` forwards the request first (it takes effect upstream) and
        then answers with the error: an "outcome unknown" failure.
        """
        def match(m: str, p: str) -> bool:
            return (method is None or m == method) and path_contains in p
        with self.lock:
            self.rules.append(_Rule(status, times, match, after_forward))

    def count(self, method: str | None = None) -> int:
        with self.lock:
            return sum(1 for m, _, _ in self.log if method is None or m == method)

    def reset(self) -> None:
        with self.lock:
            self.log.clear()
            self.rules.clear()

    def _take(self, method: str, path: str) -> _Rule | None:
        with self.lock:
            for rule in self.rules:
                if rule.times > 0 and rule.match(method, path):
                    rule.times -= 1
                    return rule
        return None

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy.lock:
                    proxy.conns.append(self.connection)

            def _any(self) -> None:
                if proxy.stopped:  # gone: drop the connection without an answer
                    self.close_connection = True
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                rule = proxy._take(self.command, self.path)
                if rule is not None and not rule.after_forward:
                    return self._error(rule.status)
                status, headers, payload = proxy._forward(self.command, self.path,
                                                          dict(self.headers), body)
                if rule is not None:
                    return self._error(rule.status)
                with proxy.lock:
                    proxy.log.append((self.command, self.path, status))
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in ("transfer-encoding", "connection",
                                            "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def _error(self, status: int) -> None:
                with proxy.lock:
                    proxy.log.append((self.command, self.path, status))
                code = "SlowDown" if status == 503 else "InternalError"
                payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                           "<Message>injected by FaultProxy</Message></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def _forward(self, method: str, path: str, headers: dict[str, str],
                 body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                          timeout=30)
        dropped = {name.lower() for name in self.strip}
        headers = {k: v for k, v in headers.items() if k.lower() not in dropped}
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def stop(self) -> None:
        """Go away like a dead server: refuse new connections, cut the open ones."""
        self.stopped = True
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
