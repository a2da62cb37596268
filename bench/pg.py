"""A local PostgreSQL server for the postgresql store, started and stopped by the bench.

The same server the tests use (tests/support/pgserver.py: initdb + postgres as an
unprivileged user, loopback port, fsync and synchronous_commit on), in
bench/work/. The server fsyncs its WAL before it acknowledges a commit, in its
own processes: the driver's strace sees no fsync for this store by design.
"""

from __future__ import annotations

import shutil
import sys
from types import TracebackType

from .common import ROOT, WORK

sys.path.insert(0, str(ROOT / "tests"))
from support.pgserver import PgServer, fresh_schema_url, pg_bin


class LocalPostgres:
    def __init__(self) -> None:
        if pg_bin() is None:
            raise RuntimeError("PostgreSQL server binaries not installed "
                               "(scripts/test-prereqs installs them)")
        root = WORK / "pg"
        shutil.rmtree(root, ignore_errors=True)
        self.server = PgServer(root)

    def __enter__(self) -> LocalPostgres:
        self.server.initdb().start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.server.stop()

    def new_store_url(self) -> str:
        return fresh_schema_url(self.server.dsn())
