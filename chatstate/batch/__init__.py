"""The resumable batch runner: one prompt over many records, one output file each.

    from chatstate.batch import Batch
    with Batch("out/", prompt="Summarise:\\n{text}", model="gpt-4o-mini") as batch:
        summary = batch.run("records.jsonl")
        assert batch.verify() == []

The recovery contract (DESIGN.md, "Batch"): the state locations are probed
before the first write; work is claimed with one atomic statement; each output
is written atomically and its sha256 recorded with ``done``; every run starts
by recovering what a killed one left; ``verify`` proves no row is stuck, every
``done`` file matches its hash, and the files on disk are exactly the ``done``
rows. Modules: ``inputs`` (JSONL/directory records), ``ledger`` (SQLite, one
host), ``pgledger`` (PostgreSQL, many hosts: claims with leases), ``outputs``
(names, atomic writes, quarantine), ``s3outputs`` (create-only objects on S3),
``recovery`` (recover, verify), ``runner`` (``Batch``), ``workers`` (who holds
a row, and is it alive); ``_api`` is the ledger and outputs interfaces.
"""

from __future__ import annotations

from chatstate.batch.inputs import InputError, Record
from chatstate.batch.recovery import Recovery
from chatstate.batch.report import Progress, Summary
from chatstate.batch.runner import Batch

__all__ = ["Batch", "InputError", "Progress", "Record", "Recovery", "Summary"]
