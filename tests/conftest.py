"""Shared fixtures: every store the contract suite runs against, one fresh URL per test.

A store joins the suite by adding a parameter to ``store_url``, not a test file.
The S3 store joins through ``tests/support/s3server.py`` (a moto server on loopback). It
skips only when its optional packages are not installed (see ``tests/support/tiers.py``);
a broken import of ``chatstate.stores.s3.store`` fails the suite. The PostgreSQL store
joins through ``tests/support/pgserver.py`` (a real server per session, one fresh schema
per test).

Every session starts clean of the developer's environment (``clean_environment``):
no ``CHATSTATE_*``/``OPENAI_*``/``AWS_*``/``PG*`` variables, no ``~/.aws`` files, no
instance metadata service, and a working directory of its own (no ``.env``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # tests/support, the helpers package
    sys.path.insert(0, str(TESTS_DIR))

from support.tiers import REQUIRE_ENV, REQUIRED, S3_MISSING, need_s3  # noqa: E402

from chatstate.stores import open_store  # noqa: E402

new_bucket_url: Callable[..., str] | None = None
collect_ignore: list[str] = []
if S3_MISSING is None:  # a broken import below fails the suite: it is not a missing extra
    from support.s3server import moto_endpoint, moto_server, new_bucket_url

    import chatstate.stores.s3.store  # noqa: F401
else:
    collect_ignore.append("contract/test_s3_store.py")  # it imports the store; the reason is below

    @pytest.fixture(scope="session")
    def moto_server() -> str:
        need_s3()
        raise AssertionError("unreachable: need_s3() skips or fails")

    @pytest.fixture
    def moto_endpoint(moto_server: str) -> str:
        return moto_server


def pytest_report_header() -> list[str]:
    if S3_MISSING is None:
        return []
    return [f"s3 tier skipped (tests/contract/test_s3_store.py not collected): {S3_MISSING}"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if S3_MISSING is not None and REQUIRED:
        raise pytest.UsageError(f"the s3 tier cannot run: {S3_MISSING} ({REQUIRE_ENV} is set, "
                                "so every tier must run)")


SUITE_SWITCHES = (REQUIRE_ENV, "CHATSTATE_TEST_TMP")
"""The suite's own settings: read by the suite, never by chatstate."""


@pytest.fixture(scope="session", autouse=True)
def clean_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The developer's shell, .env, ~/.aws and cloud metadata reach no test.

    Tests that need such a variable set it themselves (monkeypatch, or a
    subprocess's env), after this ran.
    """
    cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(("CHATSTATE_", "OPENAI_", "AWS_", "PG")) and \
                    name not in SUITE_SWITCHES:
                mp.delenv(name)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_CONFIG_FILE", str(cwd / "no-aws-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(cwd / "no-aws-credentials"))
        mp.chdir(cwd)
        yield cwd


@pytest.fixture(autouse=True)
def no_leaked_credentials() -> None:
    """No test starts with AWS credentials that an earlier test (or fixture) left behind."""
    leaked = sorted(k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                "AWS_REGION") if k in os.environ)
    assert not leaked, f"an earlier test left {leaked} in the environment"


from support.pgserver import fresh_schema_url, pg_dsn, pg_server, pg_url  # noqa: E402, F401

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
    need_s3()
    assert new_bucket_url is not None
    endpoint = request.getfixturevalue("moto_endpoint")
    return new_bucket_url(endpoint)


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh URL per test, for every store kind."""
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


INVARIANTS = range(1, 11)
"""DESIGN.md's ten invariants. A test that proves some says so with one marker naming them
all, ``@pytest.mark.invariant(3, 4)``; scripts/gen-guarantees makes docs/guarantees.md's
table from these markers."""


def invariant_problem(item: pytest.Item) -> str | None:
    """What is wrong with ``item``'s invariant marker, or None (also for a test without one)."""
    marks = list(item.iter_markers("invariant"))
    if len(marks) > 1:
        return ("has more than one invariant marker: give one with every number, "
                "@pytest.mark.invariant(3, 4)")
    if not marks:
        return None
    args, kwargs = marks[0].args, marks[0].kwargs
    if kwargs or not args or not all(type(n) is int and n in INVARIANTS for n in args) or \
            len(set(args)) != len(args):
        given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        return (f"@pytest.mark.invariant({given}) is not a list of distinct invariant "
                f"numbers: the invariants are {INVARIANTS[0]}-{INVARIANTS[-1]} (DESIGN.md)")
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything: every marker is checked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    problems = {f"{item.nodeid.split('[')[0]} {problem}": None for item in items
                if (problem := invariant_problem(item)) is not None}  # once per function
    if problems:
        raise pytest.UsageError("\n".join(problems))
