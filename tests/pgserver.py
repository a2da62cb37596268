"""A real PostgreSQL server on loopback for the tests, run as an unprivileged user.

Join a test module to the shared server with::

    from pgserver import pg_server  # a fixture

    def test_something(pg_server):
        dsn = pg_server.new_database()  # a fresh database: postgresql://chatstate@127.0.0.1:P/db

``pg_server`` (session scope) runs ``initdb`` and ``pg_ctl start`` from the
distribution's packages (``/usr/lib/postgresql/*/bin``, or ``pg_ctl`` on PATH)
in the test scratch directory, on a free loopback port with no Unix socket,
trust authentication for one role, and ``fsync`` on (the ledger refuses a
server that acknowledges before it flushes). Under root, the server runs as
``nobody``: PostgreSQL refuses to run as root, and the tests must too. Without
the binaries the tests that need them skip, naming ``scripts/test-prereqs``.
``start_server(root)`` gives a dedicated server, for tests that kill or restart it.
The interface (``PgServer.dsn``, ``new_database``, ``sql``, ``stop``,
``kill9``, ``start_server``, the ``pg_server`` fixture) is the one the
postgresql:// store's branch has, so either module serves both.

The module registers itself as both ``tests.pgserver`` and ``pgserver``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

for _alias in ("tests.pgserver", "pgserver"):
    sys.modules.setdefault(_alias, sys.modules[__name__])

ROLE = "chatstate"
__all__ = ["PgServer", "find_bin", "pg_server", "start_server"]


def find_bin() -> Path | None:
    """The directory holding initdb and pg_ctl, or None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(candidate, "initdb"), os.X_OK):
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runner() -> dict[str, Any]:
    """subprocess kwargs that drop root to ``nobody`` (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("nobody")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _traversable(path: Path) -> None:
    """Under root, let ``nobody`` reach ``path``: o+x (search only, no listing) on its parents."""
    if os.geteuid() != 0:
        return
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, (mode & 0o7777) | 0o001)


@dataclass
class PgServer:
    data: Path
    port: int
    bindir: Path

    @property
    def base_url(self) -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"{self.base_url}/{dbname}"

    def sql(self, statement: str, dbname: str = "postgres") -> list[Any]:
        """Run one statement as the superuser (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def new_database(self) -> str:
        """A fresh, empty database; returns its DSN."""
        name = f"db_{uuid.uuid4().hex[:12]}"
        self.sql(f"CREATE DATABASE {name}")
        return self.dsn(name)

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (from postmaster.pid), or None when it is not running."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def start(self, timeout: float = 60.0) -> None:
        log = self.data.parent / "server.log"
        subprocess.run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(log),
                        "-w", "-t", str(int(timeout)), "-o",
                        f"-p {self.port} -c listen_addresses=127.0.0.1 "
                        "-c unix_socket_directories='' -c fsync=on -c max_connections=60 "
                        "-c shared_buffers=16MB", "start"], check=True,
                       stdout=subprocess.DEVNULL, **_runner())

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                        "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       **_runner())

    def kill9(self) -> None:
        """SIGKILL the postmaster (its backends exit when they notice), as a crash would."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def start_server(scratch: Path) -> PgServer:
    """initdb in ``scratch/data`` and start it; the caller stops it."""
    bindir = find_bin()
    if bindir is None:
        pytest.skip(reason="PostgreSQL server binaries (initdb, pg_ctl) not found; "
                    "scripts/test-prereqs installs the 'postgresql' package")
    scratch.mkdir(parents=True, exist_ok=True)
    _traversable(scratch)
    data = scratch / "data"
    data.mkdir(mode=0o700)
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(scratch, nobody.pw_uid, nobody.pw_gid)
        os.chown(data, nobody.pw_uid, nobody.pw_gid)
    subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", ROLE, "--auth=trust",
                    "-E", "UTF8", "--no-instructions"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, cwd=scratch, **_runner())
    server = PgServer(data=data, port=_free_port(), bindir=bindir)
    server.start()
    return server


class _Shared:
    lock = threading.Lock()
    server: PgServer | None = None


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """One PostgreSQL server per pytest process, stopped at the end of the session."""
    with _Shared.lock:
        if _Shared.server is None or _Shared.server.pid is None:
            _Shared.server = start_server(tmp_path_factory.mktemp("pgserver"))
        server = _Shared.server
    try:
        yield server
    finally:
        with _Shared.lock:
            if _Shared.server is not None:
                _Shared.server.stop()
                _Shared.server = None


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
