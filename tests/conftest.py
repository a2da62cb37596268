"""Shared fixtures: every store the contract suite runs against, one fresh URL per test.

A store joins the suite by adding a parameter to ``store_url``, not a test file.
The S3 store joins through ``tests/s3server.py`` (a moto server on loopback);
until that module and ``chatstate.stores.s3`` exist, its parameter skips. The
PostgreSQL store joins through ``tests/pgserver.py`` (a real server per session,
one fresh schema per test).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # tests/ holds helper modules (stores, s3server, ...)
    sys.path.insert(0, str(TESTS_DIR))

from chatstate.stores import open_store  # noqa: E402

S3_MISSING = "S3 store not built yet (tests/s3server.py missing)"
S3_SKIP: str | None = None
new_bucket_url: Callable[..., str] | None = None

try:
    from s3server import moto_endpoint, new_bucket_url  # noqa: F401  (re-exported fixture)

    import chatstate.stores.s3  # noqa: F401
except ModuleNotFoundError as exc:
    S3_SKIP = S3_MISSING if (exc.name or "").split(".")[0] in ("s3server", "chatstate") \
        else f"S3 store unavailable: {exc}"
except ImportError as exc:
    S3_SKIP = f"S3 store unavailable: {exc}"

from pgserver import fresh_schema_url, pg_dsn, pg_server, pg_url  # noqa: E402, F401

STORE_KINDS = ["json", "sqlite", "s3", "postgresql"]
LOCAL_KINDS = ["json", "sqlite"]


def url_for(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty store URL of ``kind`` for one test."""
    if kind == "json":
        return f"json://{tmp_path}/store"
    if kind == "sqlite":
        return f"sqlite://{tmp_path}/s.db"
    if kind == "postgresql":
        return fresh_schema_url(request.getfixturevalue("pg_dsn"))
    if S3_SKIP is not None or new_bucket_url is None:
        pytest.skip(reason=S3_SKIP or S3_MISSING)
    endpoint = request.getfixturevalue("moto_endpoint")
    return new_bucket_url(endpoint)


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh URL per test, for every store kind (s3 skips until it is built)."""
    return url_for(request.param, tmp_path, request)


@pytest.fixture(params=LOCAL_KINDS)
def local_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh URL of a store whose bytes are files under ``tmp_path`` (json, sqlite)."""
    return url_for(request.param, tmp_path, request)


@pytest.fixture
def store(store_url: str) -> Iterator[Any]:
    """``open_store(store_url)``, closed after the test."""
    s = open_store(store_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def no_model_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter is configured by the test alone, not by the developer's shell."""
    for name in list(os.environ):
        if name.startswith(("CHATSTATE_", "OPENAI_")):
            monkeypatch.delenv(name)
