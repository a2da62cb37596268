"""A drill's result: counters, the table and the JSON object."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chatstate.drill._common import PHASE_LABELS, PHASES
from chatstate.drill.check import Tally

if TYPE_CHECKING:
    from chatstate.drill.rekeydrill import RekeyPhase

MAX_PROBLEMS = 50


@dataclass
class DrillResult:
    """What one drill on one store found. ``ok`` is the verdict (exit status 0)."""

    store: str
    seed: int
    requested: int
    run_id: str = ""
    trials: int = 0
    kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    write_ops: Counter[str] = field(default_factory=Counter)
    acked: int = 0
    lost: int = 0
    corrupt: int = 0
    duplicated: int = 0
    recovered: int = 0
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    seconds: float = 0.0
    stopped_early: str | None = None
    rekey: RekeyPhase | None = None
    """``drill --rekey``: the rekey phase (its losses are counted above too)."""

    @property
    def ok(self) -> bool:
        return self.trials > 0 and not (self.lost or self.corrupt or self.duplicated
                                         or self.problem_count) and \
            (self.rekey is None or self.rekey.complete)

    def add(self, tally: Tally) -> None:
        self.acked += tally.acked
        self.lost += tally.lost
        self.corrupt += tally.corrupt
        self.duplicated += tally.duplicated
        self.recovered += tally.recovered
        for problem in tally.problems:
            self.problem(problem)

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store, "ok": self.ok, "seed": self.seed, "run_id": self.run_id,
            "trials": self.trials, "requested": self.requested, "kills": dict(self.kills),
            "write_ops": dict(sorted(self.write_ops.items())), "acked": self.acked,
            "lost": self.lost, "corrupt": self.corrupt, "duplicated": self.duplicated,
            "recovered": self.recovered, "problem_count": self.problem_count,
            "problems": self.problems, "seconds": round(self.seconds, 2),
            "stopped_early": self.stopped_early,
            **({} if self.rekey is None else {"rekey": self.rekey.to_dict()}),
        }


COLUMNS = ("store", "trials", *(PHASE_LABELS[p] for p in PHASES), "acked", "lost", "corrupt",
           "duplicated", "recovered", "time")


def rows(results: list[DrillResult]) -> list[list[str]]:
    return [[r.store.split("?", 1)[0], str(r.trials), *(str(r.kills[p]) for p in PHASES),
             str(r.acked), str(r.lost), str(r.corrupt), str(r.duplicated), str(r.recovered),
             f"{r.seconds:.1f}s"] for r in results]


def render(results: list[DrillResult], console: Any) -> None:
    """The table, then each store's problems and verdict, on a rich Console."""
    from rich.table import Table

    table = Table(title="chatstate drill: SIGKILL a writer, check in a fresh process")
    for name in COLUMNS:
        table.add_column(name, justify="left" if name == "store" else "right",
                         overflow="fold")
    for row in rows(results):
        table.add_row(*row)
    console.print(table)
    for r in results:
        ops = ", ".join(f"{op} {n}" for op, n in sorted(r.write_ops.items()))
        console.print(f"{r.store}: seed {r.seed}; kills inside store writes by operation: "
                      f"{ops or 'none'}", markup=False, highlight=False)
        if r.stopped_early:
            console.print(f"  stopped early: {r.stopped_early}", markup=False)
        if r.rekey is not None:
            k = r.rekey
            when = ", ".join(f"{n} {w}" for w, n in k.killed_when.items())
            console.print(f"  rekey: {k.rotations} rotation(s) completed, {k.kills} rekey "
                          f"process(es) SIGKILLed mid-run (after which: {when}; "
                          f"{k.finished_first} finished before their kill), "
                          f"{k.writer_trials} writers killed meanwhile, "
                          f"{k.acked} acknowledged; {k.lost} lost, {k.duplicated} duplicated, "
                          f"{k.corrupt} corrupt; the old key refused after "
                          f"{k.old_key_refused}", markup=False, highlight=False)
        for text in r.problems:
            console.print(f"  PROBLEM {text}", markup=False, highlight=False)
        if r.problem_count > len(r.problems):
            console.print(f"  ... and {r.problem_count - len(r.problems)} more problems",
                          markup=False)
        verdict = "PASS: nothing acknowledged was lost" if r.ok else "FAIL"
        console.print(f"  {verdict}", markup=False, highlight=False)
