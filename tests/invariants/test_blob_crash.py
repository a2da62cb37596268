"""SIGKILL a writer that stores blobs and then the messages naming them, at random moments.

After every kill the store opens (recovery removes a dead blob writer's temp file),
the conversation loads with its chain intact, every blob it names is there with
its digest, and every acknowledged message is still stored.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest
from support import SUPPORT
from support.stores import local_path, scheme

from chatstate.stores import open_store
from chatstate.stores.blobs import verify_blobs

WRITER = SUPPORT / "blob_writer.py"


@pytest.mark.invariant(4)
def test_sigkill_during_blob_turns_loses_nothing(local_store_url: str) -> None:
    rng = random.Random(12)
    acked = -1
    kills = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, str(WRITER), local_store_url, "c1"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the writer is up and has stored one turn
        assert first.startswith("ack "), first
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        out = first + proc.communicate(timeout=60)[0]
        kills += 1
        acks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("ack ")]
        acked = max([acked, *acks])
        store = open_store(local_store_url)
        try:
            conv = store.load("c1")
            assert conv.verify() is None
            assert conv.last_seq >= acked
            assert verify_blobs(store, conv) == len(conv.messages)
        finally:
            store.close()
        if scheme(local_store_url) == "json":
            assert not [p for p in (local_path(local_store_url) / "blobs").iterdir()
                        if ".tmp-" in p.name]
    assert kills == 12
    assert acked >= 12
