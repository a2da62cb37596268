"""One record's two phases: the model call (on a request slot) and the landing (on a writer).

Splitting them keeps the request slots busy: as soon as a reply is in, its
slot claims the next record while a writer thread lands the reply: hash
recorded as "being written", atomic write, ``done`` with the hash. The record
stays ``running`` under this worker until it has landed, so a kill in between
is recovered like any other.

With transcripts, a record whose conversation another live writer holds (its
lease) is set aside: it stays this worker's, untried, until the run ends and hands
it back as ``pending`` with the reason (``Batch._set_aside``); the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chatstate.batch import outputs
from chatstate.batch._work import (
    CountingAdapter,
    OutOfAttempts,
    ask,
    ask_with_transcript,
    conversation_id,
)
from chatstate.batch.inputs import fill
from chatstate.batch.ledger import Claim
from chatstate.batch.workers import Worker
from chatstate.errors import ConversationInUse, LeaseLost, ModelError

if TYPE_CHECKING:
    from chatstate.batch._api import LedgerAPI
    from chatstate.batch.runner import Batch

FATAL_STATUS = frozenset({401, 403, 404})  # would fail every record the same way: stop the run


@dataclass(frozen=True)
class Reply:
    claim: Claim
    text: str
    conversation_id: str | None


def counts_in_claim(batch: Batch) -> bool:
    """Whether the claim itself counts the first attempt: only when nothing is persisted
    between the claim and the request (with transcripts, the user turn is)."""
    return batch._store is None


def call(batch: Batch, ledger: LedgerAPI, worker: Worker, claim: Claim, base: Any,
         on_request: Callable[[], None]) -> Reply | str:
    """Get the record's reply; or give the row up and return its new status."""
    max_attempts = batch.max_attempts

    def count() -> None:
        if not ledger.count_attempt(claim.id, worker.id, max_attempts):
            raise OutOfAttempts(f"record {claim.id!r} has no attempts left")
        on_request()

    counted = counts_in_claim(batch)
    if counted:
        on_request()
    adapter = CountingAdapter(base, max_attempts - claim.attempts, count, first_counted=counted)
    prompt = fill(batch.prompt, claim.id, claim.text)
    cid = None
    try:
        if batch._store is None:
            text = ask(adapter, prompt, system=batch.system, params=batch.params)
        else:
            cid = conversation_id(str(ledger.meta("batch_id")), claim.id)
            text = ask_with_transcript(batch._store, cid, adapter, prompt, system=batch.system,
                                       title=f"batch {claim.id}"[:120], params=batch.params,
                                       tools=batch.tools)
    except (ModelError, OutOfAttempts) as exc:
        fatal = isinstance(exc, ModelError) and exc.status in FATAL_STATUS
        final = isinstance(exc, ModelError) and not exc.retryable and not fatal
        status = ledger.fail(claim.id, worker.id, str(exc), final=final,
                             max_attempts=max_attempts)
        if fatal:
            raise
        return status or "lost"
    except (ConversationInUse, LeaseLost) as exc:  # another writer has its conversation
        who = (f"in use by host {exc.host}, pid {exc.pid}" if isinstance(exc, ConversationInUse)
               else f"taken over by another writer ({exc})")
        batch._set_aside[claim.id] = (f"its transcript, conversation {cid!r}, is {who}; left "
                                      "pending for a later run")
        return "set aside"
    return Reply(claim, text, cid)


def land(batch: Batch, ledger: LedgerAPI, worker: Worker, reply: Reply) -> str:
    """Write the reply as the record's output and mark it done; returns the outcome."""
    claim = reply.claim
    # An output is a text file: it ends with a newline, as `cat` and `wc -l` expect.
    text = reply.text if reply.text.endswith("\n") else reply.text + "\n"
    data = text.encode("utf-8", "surrogatepass")
    sha = outputs.sha256_hex(data)
    # The hash is durable before the rename, so a file that lands just before a
    # kill is recognised by recovery and adopted instead of paid for twice.
    if not ledger.set_writing(claim.id, worker.id, sha):
        batch.echo(f"dropped the reply for {claim.id!r} ({len(data)} bytes, sha256 "
                   f"{sha[:12]}…): the record is no longer this worker's (its lease lapsed "
                   "and another worker took it over)")
        return "lost"
    written = batch.outputs.write(claim.output_path, data)
    if written.moved:
        batch.echo(f"moved {claim.output_path} (not written by this batch) to {written.moved}")
    if written.taken is not None:
        # Create-only on shared storage: the output a worker that lost its lease wrote
        # first stays, and becomes the record's; ours is dropped, never written over it.
        kept = written.taken
        batch.echo(f"refused to write {claim.output_path}: another worker's output is already "
                   f"there (sha256 {kept[:12]}…); ours (sha256 {sha[:12]}…) is dropped")
        return "done" if ledger.finish(claim.id, worker.id, kept, reply.conversation_id) \
            else "lost"
    return "done" if ledger.finish(claim.id, worker.id, sha, reply.conversation_id) else "lost"
