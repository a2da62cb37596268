"""The restart drill: SIGKILL a writer again and again and prove nothing acknowledged was lost.

    from chatstate.drill import DrillOptions, run_drill
    result = run_drill("sqlite:///home/me/drill.db", DrillOptions(trials=200, seed=1))
    result.ok, result.to_dict()

Modules: ``writer`` (the fork server and the writer it forks, run as ``python
-m chatstate.drill.writer``), ``plan`` (where to kill, which phase it hit),
``server`` (the runner's end of the writer's pipes), ``check`` (the fresh-open
checker), ``leftovers`` (temp files, locks, orphan objects; cleanup),
``runner`` (the loop) and ``report`` (table and JSON). The tool-loop drill
(``drill --tools``): ``toolwriter`` (its writer fork server), ``toolserver``
(the drill's end of its pipe) and ``tooldrill`` (the loop, the checks, the
result).

Importing this package loads nothing else: the writer's imports stay lean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatstate.drill.report import DrillResult
    from chatstate.drill.runner import DrillOptions, run_drill

__all__ = ["DrillOptions", "DrillResult", "run_drill"]


def __getattr__(name: str) -> Any:
    if name in ("DrillOptions", "run_drill"):
        from chatstate.drill import runner

        return getattr(runner, name)
    if name == "DrillResult":
        from chatstate.drill.report import DrillResult

        return DrillResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
