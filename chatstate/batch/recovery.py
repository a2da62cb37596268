"""Startup is recovery; ``verify`` proves there is nothing left to recover.

``recover`` reconciles the ledger with the output directory after any crash:

- ``running`` rows of dead workers: adopted as ``done`` when the output they
  were writing landed intact (its hash was recorded before the rename), else
  back to ``pending``, or ``failed`` once they have used their attempts;
- ``done`` rows whose file is missing, or whose bytes changed (the changed file
  is quarantined), go back to ``pending`` with fresh attempts;
- temp files of killed writes are removed (never one a live worker is writing);
- output files with no ``done`` row are reported, and quarantined on request.

Rows of live workers, here or on another host, are never touched. On a shared
ledger a holder is alive while its lease runs; on SQLite, while its process does. The output
directory is scanned *before* the ledger is read, so a file that a live worker
renames meanwhile is either not seen or belongs to a row still seen as its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chatstate.batch.ledger import Row
from chatstate.batch.workers import Liveness, liveness

if TYPE_CHECKING:
    from chatstate.batch._api import LedgerAPI, Outputs


@dataclass
class Recovery:
    """What a recovery found and did; ``notes()`` says it in sentences."""

    adopted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    temps: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    live: dict[str, int] = field(default_factory=dict)

    def notes(self) -> list[str]:
        out = []
        if self.adopted:
            out.append(f"adopted {_few(self.adopted)}: a killed run had written the output "
                       "intact, so the model is not called again")
        if self.requeued:
            out.append(f"requeued {_few(self.requeued)}: their worker died mid-record")
        if self.failed:
            out.append(f"failed {_few(self.failed)}: their worker died on their last attempt")
        if self.missing:
            out.append(f"requeued {_few(self.missing)} to be redone: done, but the output "
                       "file is missing")
        for rid, moved in self.changed:
            out.append(f"requeued {rid!r} to be redone: its output changed after it was done "
                       f"(the changed file was moved to {moved})")
        if self.temps:
            out.append(f"removed {len(self.temps)} temp file(s) of killed writes: "
                       f"{_few(self.temps)}")
        for src, dest in self.quarantined:
            out.append(f"quarantined {src} -> {dest}")
        if self.extras and not self.quarantined:
            out.append(f"{len(self.extras)} file(s) in the output directory belong to no done "
                       f"record: {_few(self.extras)}; `chatstate batch recover --quarantine` "
                       "moves them to .quarantine/")
        for worker, n in self.live.items():
            out.append(f"left {n} record(s) alone: held by worker {worker}, which may still run")
        return out


def _few(items: Iterable[str], limit: int = 8) -> str:
    items = list(items)
    shown = ", ".join(repr(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def holders(ledger: LedgerAPI, rows: Iterable[Row], here: str | None = None
            ) -> dict[str, Liveness]:
    """Liveness of every worker holding one of ``rows`` (an unregistered worker is dead);
    ``here``: this host's name in the ledger (``workers.liveness``)."""
    ids = {r.worker for r in rows if r.worker and r.leased is None}
    known = ledger.workers(ids)
    out: dict[str, Liveness] = {}
    for wid in ids:
        facts = known.get(wid)
        out[wid] = "dead" if facts is None else liveness(
            facts[0], facts[1], facts[2], facts[3], ended=facts[4] is not None, here=here)
    return out


def _state(row: Row, alive: dict[str, Liveness]) -> Liveness:
    if row.leased is not None:
        return "elsewhere" if row.leased else "dead"
    return alive.get(row.worker or "", "dead")


def recover(ledger: LedgerAPI, out: Outputs, *, max_attempts: int,
            quarantine_extras: bool = False, here: str | None = None) -> Recovery:
    found = out.scan()
    rec = Recovery()
    running = ledger.rows("running")
    alive = holders(ledger, running, here)
    busy: set[str] = set()  # output paths that live workers may be writing
    for row in running:
        state = _state(row, alive)
        if state != "dead":
            rec.live[str(row.worker)] = rec.live.get(str(row.worker), 0) + 1
            busy.add(row.output_path)
        else:
            _reclaim(ledger, out, row, max_attempts, rec)
    for temp, target in found.temps.items():
        if target not in busy and out.remove_temp(temp):
            rec.temps.append(temp)
    moved: set[str] = set()
    for row in ledger.rows("done"):
        actual = out.sha256(row.output_path)
        if actual == row.output_sha256:
            continue
        if actual is None:
            if ledger.redo(row.id, str(row.output_sha256), "its output file went missing"):
                rec.missing.append(row.id)
            continue
        dest = out.quarantine(row.output_path)
        moved.add(row.output_path)
        if ledger.redo(row.id, str(row.output_sha256),
                       f"its output file changed after it was done (moved to {dest})"):
            rec.changed.append((row.id, dest))
    done = {r.output_path for r in ledger.rows("done")}
    rec.extras = sorted(found.files - done - busy - moved)
    if quarantine_extras:
        rec.quarantined = [(rel, out.quarantine(rel)) for rel in rec.extras]
    return rec


def _reclaim(ledger: LedgerAPI, out: Outputs, row: Row, max_attempts: int,
             rec: Recovery) -> None:
    """A running row whose worker is dead: adopt its landed output, requeue it, or fail it."""
    if row.writing_sha256 and out.sha256(row.output_path) == row.writing_sha256:
        if ledger.finish(row.id, row.worker, row.writing_sha256):
            rec.adopted.append(row.id)
        return
    why = (f"worker {row.worker} died while it held this record "
           f"(after {row.attempts} of {max_attempts} attempts)")
    status = ledger.fail(row.id, row.worker, why, final=False, max_attempts=max_attempts)
    if status is not None:
        (rec.failed if status == "failed" else rec.requeued).append(row.id)


def verify(ledger: LedgerAPI, out: Outputs, here: str | None = None) -> list[str]:
    """Every violation of the recovery contract, in words; empty when the batch is consistent."""
    problems = []
    running = ledger.rows("running")
    alive = holders(ledger, running, here)
    for row in running:
        if _state(row, alive) == "dead":
            problems.append(f"record {row.id!r} is 'running' but its worker {row.worker} is "
                            "gone: run `chatstate batch recover`")
        else:
            problems.append(f"record {row.id!r} is 'running' under worker {row.worker}, which "
                            "is still alive (or on another host): verify after it finishes")
    found = out.scan()
    done = ledger.rows("done")
    for row in done:
        actual = out.sha256(row.output_path)
        if actual is None:
            problems.append(f"record {row.id!r} is done but its output {row.output_path} is "
                            "missing")
        elif actual != row.output_sha256:
            problems.append(f"record {row.id!r} is done but its output {row.output_path} has "
                            f"sha256 {actual[:12]}…, not the recorded "
                            f"{str(row.output_sha256)[:12]}…")
    for extra in sorted(found.files - {r.output_path for r in done}):
        problems.append(f"{extra} is in the output directory but no record is done with it")
    for temp in sorted(found.temps):
        problems.append(f"{temp} is a temp file of an unfinished write: run "
                        "`chatstate batch recover`")
    return problems
