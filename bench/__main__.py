"""``python -m bench [--quick] [--only SCENARIO ...]``: run the benchmarks, write results.md."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable

from . import (
    report,
    s_append,
    s_batch,
    s_jsonlog,
    s_load,
    s_serve,
    s_slowdisk,
    s_startup,
    s_stream,
)
from .common import BENCH, WORK, Section, log
from .moto import Moto
from .setup_env import describe, ensure_compare_venv

SCENARIOS = ("append", "load", "stream", "startup", "batch", "slowdisk", "serve", "jsonlog")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes and fewer repetitions (about 2 minutes)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--output", default=str(BENCH / "results.md"),
                        help="where to write the report ('-' for none)")
    args = parser.parse_args(argv)
    setup = ensure_compare_venv()
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    machine = describe()
    sections: list[Section] = []
    with Moto() as moto:
        runs: dict[str, Callable[[], Section]] = {
            "append": lambda: s_append.run(args.quick, moto),
            "load": lambda: s_load.run(args.quick),
            "stream": lambda: s_stream.run(args.quick, moto),
            "startup": lambda: s_startup.run(args.quick),
            "batch": lambda: s_batch.run(args.quick),
            "slowdisk": lambda: s_slowdisk.run(args.quick),
            "serve": lambda: s_serve.run(args.quick),
            "jsonlog": lambda: s_jsonlog.run(args.quick),
        }
        for name in args.only:
            started = time.perf_counter()
            try:
                section = runs[name]()
            except Exception:  # one broken scenario must not hide the others' numbers
                section = Section(name, f"**failed**:\n\n```\n{traceback.format_exc()}```")
            section.seconds = time.perf_counter() - started
            log(f"{name}: {section.seconds:.0f} s")
            sections.append(section)
    wall = time.perf_counter() - t0
    command = "python -m bench" + (" --quick" if args.quick else "") + (
        f" --only {' '.join(args.only)}" if args.only != list(SCENARIOS) else "")
    text = report.render(machine, sections, command, wall, setup)
    print(text)
    if args.output != "-":
        with open(args.output, "w") as fh:
            fh.write(text)
        log(f"wrote {args.output} ({wall:.0f} s)")
    return 1 if any("**failed**" in s.body for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
