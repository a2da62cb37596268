"""A real PostgreSQL server for the tests, started in the test scratch folder.

``initdb`` and ``pg_ctl`` come from the distribution's packages (scripts/test-prereqs
installs them). PostgreSQL refuses to run as root, so under root the server runs
as user ``nobody`` (``setpriv``), and its folder is a fresh one in the system's
temp directory rather than the scratch folder, which that user may not reach (a
checkout in a 0700 home); nothing outside it changes mode, and it is removed when
the test process exits. The server's data need not be durable: the store's guard
judges a server by its settings (fsync, synchronous_commit), not by where it
keeps its files. The server listens on a free loopback port and on a
unix socket in its own folder (when that path fits in 107 bytes), with password
(scram) auth over TCP, so the
DSNs the tests use carry a credential that must never show up anywhere.

Fixtures:
- ``pg_server``: the session's server (a ``PgServer``), stopped at the end.
- ``pg_dsn``: its DSN (``postgresql://chatstate:…@127.0.0.1:PORT/postgres``).
- ``pg_url``: a fresh ``postgresql://…?schema=t_…`` store URL per test.

Without the binaries the fixtures skip, saying why; with
``CHATSTATE_REQUIRE_TIERS=1`` (CI) they fail instead. ``start_server(root)``
gives a dedicated server, for tests that kill or restart it. The module
registers itself as both ``tests.pgserver`` and ``pgserver``, and keeps the
names the batch-across-hosts tests use (``find_bin``, ``PgServer.pid``,
``wait_port``).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

for _alias in ("tests.pgserver", "pgserver"):
    sys.modules.setdefault(_alias, sys.modules[__name__])

PG_BIN_DIRS = [Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15, 14, 13)]
NOBODY = 65534
USER = "chatstate"
PASSWORD_PREFIX = "pg-secret-"


def pg_bin() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    for d in PG_BIN_DIRS:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


find_bin = pg_bin


def missing(reason: str) -> None:
    """Skip, or fail under CHATSTATE_REQUIRE_TIERS (tests/support/tiers.py)."""
    from support.tiers import need

    need("postgresql", False, reason)


def require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        missing("psycopg is not installed (pip install 'chatstate[postgres]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reachable_root(name: str) -> Path:
    """A folder user ``nobody`` can reach: a fresh one in the system temp directory
    (sticky and world-searchable), removed when this process exits."""
    parent = Path(tempfile.mkdtemp(prefix="chatstate-pg-"))
    os.chmod(parent, 0o711)  # searchable, not listable
    atexit.register(shutil.rmtree, parent, True)
    return parent / name


class PgServer:
    """One PostgreSQL cluster in ``root``: initdb once, then start/stop/kill at will."""

    def __init__(self, root: Path) -> None:
        bindir = pg_bin()
        assert bindir is not None
        self.bin = bindir
        self.root = root
        self.data = root / "data"
        self.sock = root / "sock"
        self.log = root / "server.log"
        self.port = free_port()
        self.password = PASSWORD_PREFIX + secrets.token_hex(8)
        self.as_root = os.geteuid() == 0
        self.proc: subprocess.Popen[bytes] | None = None

    # -- running as the server's user ---------------------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        if not self.as_root:
            return list(args)
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *args]

    def _run(self, *args: str, timeout: float = 120) -> None:
        done = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout,
                              check=False, env=self._env(), cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stdout}{done.stderr}")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        return dict(env, LC_ALL="C", HOME=str(self.root))

    def initdb(self) -> PgServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.as_root:
            for p in (self.root, self.sock, pwfile):
                os.chown(p, NOBODY, NOBODY)
        os.chmod(pwfile, 0o600)
        try:
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER,
                      f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                      "-E", "UTF8", "--no-instructions")
        finally:
            pwfile.unlink()
        # a unix socket path holds at most 107 bytes; in a deep scratch folder the server
        # listens on loopback TCP only (which is what the tests connect to anyway)
        sockets = str(self.sock) if len(str(self.sock)) + 20 <= 107 else ""
        with open(self.data / "postgresql.conf", "a") as conf:
            # durable defaults (fsync, synchronous_commit, full_page_writes stay on):
            # the store refuses a server that acknowledges before flushing
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{sockets}'\nmax_connections = 200\n"
                       "shared_buffers = 16MB\n")
        return self

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, or None when it is not running."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, timeout: float = 60.0) -> None:
        """Start the postmaster directly (so a test can SIGKILL it) and wait until it serves."""
        logf = open(self.log, "ab")  # noqa: SIM115  (the server keeps writing to it)
        if self.as_root:
            os.chown(self.log, NOBODY, NOBODY)
        self.proc = subprocess.Popen(self._cmd(str(self.bin / "postgres"), "-D", str(self.data)),
                                     stdout=logf, stderr=logf, env=self._env(),
                                     start_new_session=True, cwd=self.root)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log.read_text()[-2000:]}")
            if self._accepts():
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not start in {timeout:.0f} s: "
                           f"{self.log.read_text()[-2000:]}")

    def _accepts(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def kill9(self) -> None:
        """SIGKILL the postmaster (its backends die with it once it is gone)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        # orphaned backends exit when they notice the postmaster is gone; wait for
        # the shared memory to be released so a restart is not refused
        deadline = time.monotonic() + 30
        while (self.data / "postmaster.pid").exists() and time.monotonic() < deadline:
            if not _pid_alive(self.data / "postmaster.pid"):
                break
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM if mode == "smart" else signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill9()

    def dsn(self, dbname: str = "postgres") -> str:
        return (f"postgresql://{USER}:{quote(self.password)}@127.0.0.1:{self.port}/{dbname}")

    def sql(self, statement: str, dbname: str = "postgres") -> list[Any]:
        """Run one statement as the superuser (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def new_database(self) -> str:
        """A fresh, empty database; returns its DSN."""
        name = "db_" + secrets.token_hex(6)
        self.sql(f"CREATE DATABASE {name}")
        return self.dsn(name)


def _pid_alive(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def start_server(root: Path) -> PgServer:
    """A new, running server in ``root`` (skips/fails when PostgreSQL is missing)."""
    require_psycopg()
    if pg_bin() is None:
        missing("PostgreSQL server binaries (initdb, pg_ctl) not installed "
                "(scripts/test-prereqs installs them)")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        missing("running as root needs setpriv to start PostgreSQL as user nobody")
    if os.geteuid() == 0:
        root = _reachable_root(root.name)
    server = PgServer(root).initdb()
    server.start()
    return server


def fresh_schema_url(dsn: str, **query: str) -> str:
    """A store URL on ``dsn`` with a new schema name (the store creates it)."""
    params = "&".join(f"{k}={v}" for k, v in {"schema": "t_" + secrets.token_hex(6),
                                               **query}.items())
    return f"{dsn}?{params}"


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    server = start_server(tmp_path_factory.mktemp("pg"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_dsn(pg_server: PgServer) -> str:
    """The session server's DSN, with its password (never to be printed by the code)."""
    return pg_server.dsn()


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    """A fresh PostgreSQL store URL (own schema) for one test."""
    return fresh_schema_url(pg_dsn)


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
