"""The s3 store checks the server itself: it honours conditional writes (issue 21 item 2).

Behind a proxy that drops ``If-None-Match``/``If-Match`` every create-only PUT and
every If-Match PUT silently becomes a plain overwrite, and racing writers both
win a seq. The store refuses such a server at open and ``doctor`` says NOT READY,
in one line that names the server and the missing feature; plain moto passes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from support.s3server import FaultProxy, make_bucket, moto_endpoint, s3_url

from chatstate.cli import cli
from chatstate.errors import StoreUnavailable
from chatstate.stores import open_store

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here

BOTH = ("If-None-Match", "If-Match")


@pytest.fixture
def stripping(moto_endpoint: str, request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    strip = getattr(request, "param", BOTH)
    proxy = FaultProxy(moto_endpoint, strip=strip).start()
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("stripping, missing", [
    (BOTH, "If-None-Match: *"),
    (("If-None-Match",), "If-None-Match: *"),
    (("If-Match",), "If-Match"),
], indirect=["stripping"], ids=["both", "if-none-match", "if-match"])
def test_open_refuses_a_server_that_drops_conditional_writes(stripping: FaultProxy,
                                                             missing: str) -> None:
    bucket = make_bucket(stripping.upstream)
    url = s3_url(stripping.endpoint, bucket)
    with pytest.raises(StoreUnavailable) as info:
        open_store(url)
    said = str(info.value)
    assert "\n" not in said
    assert f"S3 server {stripping.endpoint}" in said
    assert f"does not honour {missing} " in said
    keys = [p for m, p, _ in stripping.log if m == "PUT" and "chatstate.json" in p]
    assert keys == []  # refused before the store marker (or anything else) was written


def test_doctor_is_not_ready_behind_the_stripping_proxy(stripping: FaultProxy) -> None:
    url = s3_url(stripping.endpoint, make_bucket(stripping.upstream))
    result = CliRunner().invoke(cli, ["--store", url, "doctor", "--store-only"])
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("NOT READY")
    assert f"{stripping.endpoint} (bucket" in result.stdout
    assert "does not honour If-None-Match" in result.stdout


def test_plain_moto_passes_and_check_says_so(moto_endpoint: str) -> None:
    proxy = FaultProxy(moto_endpoint).start()  # counts the probe's requests
    try:
        url = s3_url(proxy.endpoint, make_bucket(moto_endpoint))
        store = open_store(url)
        probes = [(m, p) for m, p, _ in proxy.log if "_probe/cond-" in p]
        assert [m for m, _ in probes] == ["PUT", "PUT", "PUT", "HEAD"]
        assert store.io.keys("_probe") == []  # and deleted
        report = store.check()
        assert report.ok, report.error
        assert report.steps[-1].startswith("refused: a second create-only PUT")
        store.close()
        proxy.reset()
        open_store(url).close()  # once per process per endpoint and bucket
        assert not [p for _, p, _ in proxy.log if "_probe/cond-" in p]
        result = CliRunner().invoke(cli, ["--store", url, "doctor", "--store-only"])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("READY")
    finally:
        proxy.stop()
