"""Fault runs per store, for the closing note: ``python -m bench.faults [--trials N]``.

Reuses the drill (chatstate.drill.runner.run_drill): each trial SIGKILLs a
real writer at a planned point and the drill's own checker verifies, from a
fresh open, that every acknowledged message is stored. Built so far: kill -9
of the writer on json, sqlite, s3 (moto) and postgresql (a local server, when
the binaries are installed). Not built yet: strace ENOSPC/EIO, lazyfs power
cuts, S3 FaultProxy 500/503s and PostgreSQL server kill -9 + restart
(each is covered by its own test under tests/invariants/, not counted here).

Prints one table: store | fault kind | trials | faults fired | acknowledged | lost.
Exit status 1 when anything was lost, corrupt, duplicated or a trial had a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .common import AWS_ENV, WORK

COLUMNS = ("store", "fault kind", "trials", "faults fired", "acknowledged", "lost")


@contextlib.contextmanager
def _store_urls(stores: list[str], root: Path) -> Iterator[dict[str, str]]:
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for name in stores:
            if name == "json":
                urls[name] = f"json://{root / 'json'}"
            elif name == "sqlite":
                urls[name] = f"sqlite://{root / 'drill.db'}"
            elif name == "s3":
                from .moto import Moto
                os.environ.update(AWS_ENV)
                urls[name] = stack.enter_context(Moto()).new_store_url("faults")
            elif name == "postgresql":
                from .pg import LocalPostgres
                urls[name] = stack.enter_context(LocalPostgres()).new_store_url()
        yield urls


def run(stores: list[str], trials: int, seed: int) -> tuple[list[list[str]], bool]:
    from chatstate.drill.runner import DrillOptions, run_drill

    rows: list[list[str]] = []
    ok = True
    WORK.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK) as tmp, _store_urls(stores, Path(tmp)) as urls:
        for name in stores:
            result = run_drill(urls[name], DrillOptions(trials=trials, seed=seed))
            fired = sum(result.kills.values())
            rows.append([name, "kill -9 writer", str(result.trials), str(fired),
                         str(result.acked), str(result.lost)])
            bad = result.lost or result.corrupt or result.duplicated or result.problem_count
            if bad or not result.ok:
                ok = False
                for text in result.problems:
                    print(f"{name}: PROBLEM {text}", file=sys.stderr)
    return rows, ok


def table(rows: list[list[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(COLUMNS), "-+-".join("-" * w for w in widths),
                       *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40, help="trials per store and fault kind")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--stores", default="json,sqlite,s3,postgresql",
                        help="comma-separated; postgresql is skipped when not installed")
    args = parser.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    if "postgresql" in stores:
        from .pg import pg_bin
        if pg_bin() is None:
            print("postgresql: skipped, server binaries not installed "
                  "(scripts/test-prereqs installs them)", file=sys.stderr)
            stores.remove("postgresql")
    rows, ok = run(stores, args.trials, args.seed)
    print(table(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
