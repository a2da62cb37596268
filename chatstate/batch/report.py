"""What a batch run tells its caller: periodic progress, and the summary at the end."""

from __future__ import annotations

from dataclasses import dataclass, field


def _duration(seconds: float) -> str:
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass(frozen=True)
class Progress:
    """A snapshot of the ledger during a run (counts include other runners' work)."""

    counts: dict[str, int]
    done_now: int
    """Records this run completed so far."""
    elapsed: float

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def rate(self) -> float:
        """Records per second completed by this run."""
        return self.done_now / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        left = self.counts["pending"] + self.counts["running"]
        return left / self.rate if self.rate > 0 else None

    def line(self) -> str:
        c = self.counts
        eta = f", ETA {_duration(self.eta)}" if self.eta is not None else ""
        return (f"batch: {c['done']}/{self.total} done, {c['failed']} failed, "
                f"{c['pending'] + c['running']} to go, {self.rate:.1f}/s{eta}")


@dataclass
class Summary:
    """The end of a run. ``ok`` is False when any record in the ledger has failed."""

    counts: dict[str, int]
    done_now: int = 0
    failed_now: int = 0
    attempts: int = 0
    """Model requests this run sent (each counted in the ledger before it was sent)."""
    adopted: int = 0
    elapsed: float = 0.0
    interrupted: bool = False
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(record id, last error) of failed records, at most 20."""

    @property
    def ok(self) -> bool:
        return self.counts["failed"] == 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        c = self.counts
        rate = self.done_now / self.elapsed if self.elapsed > 0 else 0.0
        head = "batch interrupted" if self.interrupted else "batch finished"
        out = [f"{head}: {c['done']}/{self.total} done, {c['failed']} failed, "
               f"{c['pending']} pending, {c['running']} running",
               f"this run: {self.done_now} done, {self.failed_now} failed, {self.adopted} "
               f"adopted, {self.attempts} model requests in {self.elapsed:.1f}s "
               f"({rate:.1f} records/s)"]
        for rid, error in self.failures:
            out.append(f"failed {rid!r}: {error}")
        if c["failed"] > len(self.failures):
            out.append(f"... {c['failed'] - len(self.failures)} more failed; see "
                       "`chatstate batch status`")
        if c["failed"]:
            out.append("a failed record is not tried again by a plain rerun: once the cause is "
                       "fixed, rerun the same command with --retry-failed")
        return out
