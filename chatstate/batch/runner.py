"""``Batch``: one prompt over many records, one output file each, resumable after kill -9.

The order of every record's life is fixed: claim (one conditional UPDATE,
which also counts the first attempt when the request follows at once) ->
[with transcripts: persist the user turn, then count the attempt] -> call the
model (each retry counted before it is sent) -> record the output's hash as
"being written" -> atomic write (temp, fsync, rename, fsync dir) -> ``done``
with the hash (one statement). A kill at any point leaves a state that
``recover`` (which every run starts with) can finish: see ``recovery``. The
threads are in ``_pool``; one record's steps in ``_record``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatstate.batch import outputs, pgledger, s3outputs
from chatstate.batch._work import SerialisedStore
from chatstate.batch.inputs import InputError, Record, read_records, records_from
from chatstate.batch.ledger import Ledger
from chatstate.batch.recovery import Recovery, recover, verify
from chatstate.batch.report import Progress, Summary
from chatstate.batch.workers import Worker
from chatstate.errors import ConfigurationError, InvalidOption

if TYPE_CHECKING:
    from chatstate.batch._api import LedgerAPI, Outputs
    from chatstate.durable.guard import Report
    from chatstate.stores.base import Store

LEDGER_NAME = ".chatstate-batch.db"
DEFAULT_MAX_ATTEMPTS = 3
Source = str | os.PathLike[str] | Iterable[Record | Mapping[str, Any] | str]


class Batch:
    """A resumable batch over an output directory and its ledger.

    ``Batch(out, *, prompt="{text}", ledger=None, system=None, model=None,
    base_url=None, api_key=None, adapter=None, params=None, concurrency=4,
    max_attempts=None, transcripts=None, allow_ephemeral=False, echo=None,
    host_id=None, lease=30.0, tools=None, api=None)``

    - ``out``: the output directory (one ``<encoded id>.txt`` per record), or
      ``s3://bucket/prefix?endpoint_url=…`` (shared: written create-only).
    - ``prompt``: template; ``{text}`` and ``{id}`` are filled in.
    - ``ledger``: the SQLite ledger path (default ``out/.chatstate-batch.db``),
      or ``postgresql://…`` for a ledger shared by workers on many hosts (each
      claim then holds a lease of ``lease`` seconds, renewed while in flight).
    - ``host_id``: this worker's host name in the ledger (default:
      ``CHATSTATE_HOST_ID``, else the hostname).
    - ``model``/``base_url``/``api_key``/``api`` or ``adapter``: the model, as for
      ``make_adapter`` (``api``: the wire API, else ``CHATSTATE_API``); ``params``:
      extra request parameters (temperature, ...).
    - ``max_attempts``: model requests per record before it is ``failed``
      (default: the ledger's last value, else 3); every request counts,
      including the adapter's retries after a 429 or a 5xx.
    - ``transcripts``: a Store; each call is also kept there as a one-turn
      conversation ``batch-<batch id>-<sha256(id)[:16]>``.
    - ``echo``: where notes go (probe verdicts, recovery, changed records);
      default: stderr. Ephemeral locations raise ``EphemeralStoreError``
      unless ``allow_ephemeral`` (or ``CHATSTATE_ALLOW_EPHEMERAL=1``).

    ``run(source=None, *, limit=None, progress=None, interval=0.5) -> Summary``
    registers ``source`` (a .jsonl path, a directory, or records), recovers, and
    processes pending records; ``add``, ``recover``, ``status`` and ``verify``
    are the other verbs. Use as a context manager, or call ``close()``.
    """

    def __init__(self, out: str | os.PathLike[str], *, prompt: str = "{text}",
                 ledger: str | os.PathLike[str] | None = None, system: str | None = None,
                 model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, adapter: Any = None,
                 params: Mapping[str, Any] | None = None, concurrency: int = 4,
                 max_attempts: int | None = None, transcripts: Store | None = None,
                 allow_ephemeral: bool = False,
                 echo: Callable[[str], None] | None = None, host_id: str | None = None,
                 lease: float = pgledger.DEFAULT_LEASE, tools: Iterable[Any] | None = None,
                 api: str | None = None) -> None:
        if "{text}" not in prompt and "{id}" not in prompt:
            raise InvalidOption("the prompt template must contain {text} (or {id})")
        if concurrency < 1 or (max_attempts is not None and max_attempts < 1):
            raise InvalidOption("concurrency and max_attempts must be at least 1")
        if lease <= 0:
            raise InvalidOption("lease must be a positive number of seconds")
        if tools is not None and transcripts is None:
            raise InvalidOption("tools need transcripts (--transcripts): every step of the "
                                "tool loop is stored, so a killed run never repeats a call")
        self.tools = tools
        out_s, raw = os.fspath(out), os.fspath(ledger) if ledger is not None else None
        self.ledger_url = raw if raw and pgledger.is_url(raw) else None
        self.outputs: Outputs
        if s3outputs.is_url(out_s):
            if self.ledger_url is None:
                raise InvalidOption(f"outputs on shared storage ({out_s.split('?')[0]}) need a "
                                    "shared ledger: pass --ledger postgresql://…")
            self.outputs = s3outputs.S3Outputs(out_s)
            self.out = Path(out_s.split("?", 1)[0])  # a name for messages only
        else:
            self.out = Path(out_s).expanduser().absolute()
            self.outputs = outputs.LocalOutputs(self.out)
        if raw and raw.startswith("sqlite://"):
            raw = raw[len("sqlite://"):]
        self.ledger_path = Path(raw).expanduser().absolute() if raw and not self.ledger_url \
            else self.out / LEDGER_NAME
        self.host_id = host_id or os.environ.get("CHATSTATE_HOST_ID") or None
        self.lease = lease
        self.prompt, self.system, self.params = prompt, system, dict(params or {})
        self.concurrency = concurrency
        self._max_attempts = max_attempts
        self._model_args = {"model": model, "base_url": base_url, "api_key": api_key,
                            "api": api}
        self._adapter = adapter
        self._store = SerialisedStore(transcripts) if transcripts is not None else None
        self._set_aside: dict[str, str] = {}
        """Records whose conversation another writer held this run: record id -> why."""
        self.allow_ephemeral = allow_ephemeral
        self.echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
        self._ledger: LedgerAPI | None = None
        self._reports: list[Report] | None = None

    def _same_prompt(self, ledger: LedgerAPI) -> None:
        """One output directory, one prompt: a changed template would mix two jobs' outputs."""
        job = json.dumps({"prompt": self.prompt, "system": self.system}, sort_keys=True)
        first = ledger.set_meta("job", job, only_if_absent=True)
        if first != job:
            was = json.loads(first)
            raise InputError(
                f"{self.outputs.where} was started with another prompt or system message "
                f"(prompt {was['prompt']!r}, system {was['system']!r}); its done outputs came "
                "from that one. Rerun with the same --prompt/--system, or use a new --out.")
        for name in sorted(set(re.findall(r"\{(\w+)\}", self.prompt)) - {"text", "id"}):
            self.echo(f"note: {{{name}}} in the prompt is not a placeholder (only {{text}} and "
                      "{id} are); it is sent as written")

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    # -- setup -------------------------------------------------------------------
    def probe(self) -> list[Report]:
        """Inspect (once) where the ledger and the outputs land, say so, refuse ephemeral ones."""
        if self._reports is None:
            from chatstate.durable.guard import inspect
            from chatstate.errors import EphemeralStoreError
            from chatstate.stores import allow_ephemeral_from_env

            allowed = self.allow_ephemeral or allow_ephemeral_from_env()
            if self.ledger_url or self.outputs.shared:
                self._reports = self._probe_shared(inspect)
                return self._reports
            reports = [inspect(self.ledger_path), inspect(self.out)]
            named = list(zip(("ledger", "outputs"), reports, strict=True))
            for what, rep in named:
                self.echo(f"{what} {rep.path} {rep.one_line()} (device {rep.device or '?'})")
            bad = [(what, rep) for what, rep in named if rep.verdict == "ephemeral"]
            if bad and not allowed:
                raise EphemeralStoreError(
                    "refusing " + "; ".join(f"batch {what} at {rep.path}: {rep.reasons[0]}"
                                            for what, rep in bad)
                    + " That would not survive a restart. Use a durable directory, or accept "
                    "the loss with --allow-ephemeral, allow_ephemeral=True or "
                    "CHATSTATE_ALLOW_EPHEMERAL=1.")
            if reports[0].device != reports[1].device:
                self.echo(f"warning: the ledger (device {reports[0].device}) and the outputs "
                          f"(device {reports[1].device}) are on different devices: they would "
                          "not survive the same events; keep them together")
            self._reports = reports
        return self._reports

    def _probe_shared(self, inspect: Callable[[Path], Report]) -> list[Report]:
        """A server ledger is checked by the server's own settings (``pgledger``); a local
        output directory beside it is probed as always; S3 acknowledges durably."""
        from chatstate.errors import EphemeralStoreError
        from chatstate.stores import allow_ephemeral_from_env

        self.echo(f"ledger {pgledger.shown(self.ledger_url or '')} (PostgreSQL: fsync and "
                  "synchronous_commit checked on open)")
        if self.outputs.shared:
            self.echo(f"outputs {self.outputs.where} (object store: create-only writes)")
            return []
        rep = inspect(self.out)
        self.echo(f"outputs {rep.path} {rep.one_line()} (device {rep.device or '?'})")
        if rep.verdict == "ephemeral" and not (self.allow_ephemeral or allow_ephemeral_from_env()):
            raise EphemeralStoreError(
                f"refusing batch outputs at {rep.path}: {rep.reasons[0]} That would not survive "
                "a restart. Use a durable directory, or accept the loss with --allow-ephemeral.")
        return [rep]

    def _open(self, *, create: bool) -> LedgerAPI:
        if self._ledger is None:
            ledger: LedgerAPI
            if self.ledger_url:
                from chatstate.stores import allow_ephemeral_from_env

                ledger = pgledger.PgLedger(self.ledger_url, lease=self.lease, allow_unsafe=(
                    self.allow_ephemeral or allow_ephemeral_from_env()))
            else:
                network = bool(self._reports and self._reports[0].network_fs)
                ledger = Ledger.open(self.ledger_path, create=create, network=network)
            self._bind(ledger)
            self._ledger = ledger
        return self._ledger

    def _bind(self, ledger: LedgerAPI) -> None:
        """A ledger outside DIR belongs to one DIR; inside, it moves with it.

        Writes only to a new ledger, so that status and verify leave it untouched.
        """
        here = self.outputs.where
        stored = ledger.meta("out_dir") or ledger.set_meta("out_dir", here, only_if_absent=True)
        inside = not self.ledger_url and self.out in self.ledger_path.parents
        if stored != here and not inside:
            ledger.close()
            raise ConfigurationError(f"ledger {ledger.where} belongs to output directory "
                                     f"{stored}, not {here}: pass --out {stored}, or another "
                                     "--ledger")
        if ledger.meta("batch_id") is None:
            ledger.set_meta("batch_id", os.urandom(4).hex(), only_if_absent=True)

    @property
    def ledger_where(self) -> str:
        """The ledger, for messages: a path, or the URL without its password."""
        return pgledger.shown(self.ledger_url) if self.ledger_url else str(self.ledger_path)

    @property
    def max_attempts(self) -> int:
        if self._max_attempts is not None:
            return self._max_attempts
        stored = self._ledger.meta("max_attempts") if self._ledger else None
        return int(stored) if stored else DEFAULT_MAX_ATTEMPTS

    # -- verbs -------------------------------------------------------------------
    def add(self, source: Source) -> tuple[int, list[str]]:
        """Register records idempotently. Returns (added, ids whose text changed: not applied)."""
        local = not self.outputs.shared
        if isinstance(source, (str, os.PathLike)):
            if local:
                self._outside_out(Path(source))
            records = read_records(source, skip=self.out if local else None)
        else:
            records = records_from(source)
        self.probe()
        ledger = self._open(create=True)
        self.outputs.prepare()
        added, changed = ledger.register(
            (r.id, r.text, r.sha256, outputs.output_name(r.id)) for r in records)
        if changed:
            self.echo(f"warning: {len(changed)} record(s) changed since they were registered "
                      f"and were left as registered (their outputs follow the old text): "
                      + ", ".join(repr(c) for c in changed[:10])
                      + (f" and {len(changed) - 10} more" if len(changed) > 10 else ""))
        return added, changed

    def _outside_out(self, source: Path) -> None:
        real, out = Path(os.path.realpath(source)), Path(os.path.realpath(self.out))
        inside = real == out or out in real.parents
        if inside and not any(p.startswith(".") for p in real.relative_to(out).parts):
            raise InputError(f"the input {source} is inside the output directory {self.out}, "
                             "where every file is taken for an output: move it elsewhere")

    def recover(self, *, quarantine: bool = False) -> Recovery:
        """Reconcile the ledger with DIR after a crash (see ``recovery``); says what it did."""
        self.probe()
        ledger = self._open(create=False)
        result = recover(ledger, self.outputs, max_attempts=self.max_attempts,
                         quarantine_extras=quarantine, here=self.host_id)
        for note in result.notes():
            self.echo(f"recovered: {note}" if not note.startswith("left") else note)
        return result

    def status(self) -> dict[str, int]:
        """Record counts by status."""
        return self._open(create=False).counts()

    def failures(self, limit: int = 20) -> list[tuple[str, str]]:
        rows = self._open(create=False).rows("failed")[:limit]
        return [(r.id, r.last_error or "") for r in rows]

    def verify(self) -> list[str]:
        """Every violation of the recovery contract (empty: consistent). Writes nothing."""
        return verify(self._open(create=False), self.outputs, self.host_id)

    def run(self, source: Source | None = None, *, limit: int | None = None,
            progress: Callable[[Progress], None] | None = None,
            interval: float = 0.5, retry_failed: bool = False) -> Summary:
        """Register ``source``, recover, then process pending records (at most ``limit``).

        ``retry_failed`` first gives every ``failed`` record fresh attempts (after the
        cause, say a bad prompt or an outage, is fixed); otherwise they stay failed.
        """
        from chatstate.batch._pool import Pool

        started = time.monotonic()
        if source is not None:
            self.add(source)
        self.probe()
        ledger = self._open(create=True)
        self._same_prompt(ledger)
        self.outputs.prepare()
        self._max_attempts = self.max_attempts  # resolved once: the threads read it often
        ledger.set_meta("max_attempts", str(self._max_attempts))
        found = self.recover()
        if retry_failed:
            again = ledger.requeue_failed()
            self.echo(f"retrying {len(again)} failed record(s) with fresh attempts")
        for rid in ledger.expire(self.max_attempts):
            self.echo(f"failed {rid!r}: it has used its {self.max_attempts} attempts")
        worker = Worker.current(self.host_id)
        ledger.add_worker(worker)
        pool = Pool(self, ledger, worker, limit)
        self._set_aside.clear()
        try:
            pool.run(progress, interval, started)
        finally:
            for rid, why in self._set_aside.items():  # held by another writer: not tried
                ledger.fail(rid, worker.id, why, final=False, max_attempts=self.max_attempts)
                self.echo(f"record {rid!r}: {why}")
            ledger.release(worker.id, self.max_attempts, "the run stopped while it held this "
                           "record")
            ledger.end_worker(worker.id)
            pool.close()
        return Summary(counts=ledger.counts(), done_now=pool.tally["done"],
                       failed_now=pool.tally["failed"], attempts=pool.tally["attempts"],
                       adopted=len(found.adopted), elapsed=time.monotonic() - started,
                       interrupted=pool.interrupted, failures=self.failures())
