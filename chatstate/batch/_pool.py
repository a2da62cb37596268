"""The threads of one run: request slots that call the model, writers that land replies.

``concurrency`` request threads each claim a record, get its reply and hand it
to a writer, then claim the next, so at most that many model requests are in
flight and none waits for a disk's fsyncs. At most ``2 * concurrency`` replies
wait for a writer (back-pressure on a slow disk). The first unexpected error
(a full disk, a bad API key) stops every thread from claiming more; the run
re-raises it once the records in flight have landed. Ctrl-C does the same, and
a second Ctrl-C abandons them (the next run recovers their rows).

On a shared ledger a heartbeat thread renews the leases of the rows this
worker holds (every third of the lease), and a slot that finds nothing to
claim waits while another worker still holds rows: if that worker dies or
freezes, its lease lapses and this one takes the rows over.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from chatstate.batch._record import Reply, call, counts_in_claim, land
from chatstate.batch.report import Progress
from chatstate.batch.workers import Worker

if TYPE_CHECKING:
    from chatstate.batch._api import LedgerAPI
    from chatstate.batch.runner import Batch


class Pool:
    def __init__(self, batch: Batch, ledger: LedgerAPI, worker: Worker, limit: int | None) -> None:
        self.batch, self.ledger, self.worker = batch, ledger, worker
        self.tally: Counter[str] = Counter()
        self.interrupted = False
        self._left = limit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._errors: list[BaseException] = []
        self._owned = batch._adapter is None
        self._base = batch._adapter if batch._adapter is not None else self._make_adapter()
        self._writers = ThreadPoolExecutor(batch.concurrency, thread_name_prefix="batch-write")
        self._room = threading.BoundedSemaphore(2 * batch.concurrency)

    def _make_adapter(self) -> Any:
        from chatstate.adapter import make_adapter

        args = self.batch._model_args
        return make_adapter(model=args["model"], base_url=args["base_url"],
                            api_key=args["api_key"], api=args["api"])

    def close(self) -> None:
        if self._owned and hasattr(self._base, "close"):
            self._base.close()

    def run(self, progress: Callable[[Progress], None] | None, interval: float,
            started: float) -> None:
        threads = [threading.Thread(target=self._loop, name=f"batch-{n}", daemon=True)
                   for n in range(self.batch.concurrency)]
        beat = threading.Thread(target=self._heartbeat, name="batch-lease", daemon=True)
        if self.ledger.lease_seconds is not None:
            beat.start()
        for thread in threads:
            thread.start()
        try:
            try:
                self._wait(threads, progress, interval, started)
            except KeyboardInterrupt:
                self.interrupted = True
                self._stop.set()
                self.batch.echo("interrupted: finishing the requests in flight (Ctrl-C again "
                                "to abandon them)")
                self._wait(threads, None, interval, started)
        finally:
            self._writers.shutdown(wait=True)  # every reply lands before rows are released
            self._finished.set()
            if beat.is_alive():
                beat.join()
        if progress is not None:
            progress(self.snapshot(started))
        if self._errors:
            raise self._errors[0]

    def _wait(self, threads: list[threading.Thread], progress: Callable[[Progress], None] | None,
              interval: float, started: float) -> None:
        while any(t.is_alive() for t in threads):
            deadline = time.monotonic() + interval
            for thread in threads:
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))
            if progress is not None:
                progress(self.snapshot(started))

    def snapshot(self, started: float) -> Progress:
        return Progress(counts=self.ledger.counts(), done_now=self.tally["done"],
                        elapsed=time.monotonic() - started)

    def _take(self) -> bool:
        with self._lock:
            if self._left is None:
                return True
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def _give_back(self) -> None:
        with self._lock:
            if self._left is not None:
                self._left += 1

    def _counted(self) -> None:
        with self._lock:
            self.tally["attempts"] += 1

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)
        self._stop.set()

    def _loop(self) -> None:
        count = counts_in_claim(self.batch)
        try:
            while not self._stop.is_set() and self._take():
                claim = self.ledger.claim(self.worker.id, self.batch.max_attempts, count=count)
                if claim is None:
                    self._give_back()
                    if self._wait_for_others():
                        continue
                    return
                result = call(self.batch, self.ledger, self.worker, claim, self._base,
                              self._counted)
                if isinstance(result, str):
                    with self._lock:
                        self.tally[result] += 1
                    continue
                self._room.acquire()
                self._writers.submit(self._land, result)
        except BaseException as exc:
            self._failed(exc)

    def _wait_for_others(self) -> bool:
        """Nothing claimable: wait (True) while another worker's lease may still lapse."""
        hint = self.ledger.wait_hint(self.worker.id)
        if hint is None:
            return False
        self.ledger.expire(self.batch.max_attempts)  # lapsed rows out of attempts: not claimable
        self._stop.wait(min(max(hint, 0.05), 1.0))
        return True

    def _heartbeat(self) -> None:
        """Renew this worker's leases until the request slots and writers are done."""
        lease = float(self.ledger.lease_seconds or 0)
        try:
            while not self._finished.wait(lease / 3):
                self.ledger.renew(self.worker.id)
        except BaseException as exc:
            self._failed(exc)

    def _land(self, reply: Reply) -> None:
        try:
            outcome = land(self.batch, self.ledger, self.worker, reply)
            with self._lock:
                self.tally[outcome] += 1
        except BaseException as exc:
            self._failed(exc)
        finally:
            self._room.release()
