"""A burst of new conversations through ``chatstate serve``, two builds side by side.

    python bench/serve_burst.py [--conversations 200] [--stores sqlite json] [--reps 3]
                                [--before /path/to/a/checkout/of/main] [--after CHECKOUT]

The last row of issue 26: N header-less streams at once (each a first turn, so a
new conversation), the first-chunk p50 that ``serve`` adds over the upstream alone,
as a ratio to what the bare relay (``relay_floor.py``) adds in the same repetition
(and the same at p90).
Each repetition measures the upstream alone, the relay, then ``serve`` on each
store, with ``--before`` (a checkout whose code the proxy imports instead, by
``PYTHONPATH``) right before this build's, so a before/after pair shares the
machine's load. Also prints the proxy's CPU seconds over the burst (from
``/proc``), which the load moves less than latency. Every stored conversation is
checked as in ``serve_load.py`` (lost, duplicated).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import serve_load as sl  # the same client, percentiles and checks


def cpu_seconds(proc: subprocess.Popen[str] | None) -> float:
    if proc is None:
        return 0.0
    with open(f"/proc/{proc.pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "json"],
                        choices=["sqlite", "json", "memory"],
                        help="memory: the proxy with store writes that cost next to nothing "
                        "(what serve adds beyond the relay that is not the store's)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", help="a checkout whose chatstate to measure first")
    parser.add_argument("--after", help="a checkout to measure as this build (by PYTHONPATH, "
                        "as --before is: the same way in, so only the code differs)")
    parser.add_argument("--dir", default="bench/work/burst")
    args = parser.parse_args()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    builds = ([("before", args.before)] if args.before else []) + [("this", args.after)]
    fake, base = sl.start([sl.CHATSTATE, "fake-server", "--reply-words", "40",
                           "--chunk-delay", "0.02"], r"(http://\S+/v1)", env)
    print("| rep | run | first chunk p50 ms | added ms | ÷ relay's | p90 ms | added ms | "
          "÷ relay's | proxy CPU s | lost | dup |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    try:
        for rep in range(args.reps):
            runs: list[tuple[str, str | None, str | None]] = [("upstream alone", None, None),
                                                              ("bare relay", "floor", None)]
            runs += [(f"{store} ({name})", store, path) for store in args.stores
                     for name, path in builds]
            direct = floor = direct90 = floor90 = 0.0
            for label, kind, path in runs:
                proxy, url, store_url = None, base, ""
                if kind == "floor":
                    proxy, url = sl.start([sys.executable, str(Path(__file__).with_name(
                        "relay_floor.py")), "--upstream", base], r"serving on (http://\S+/v1)",
                        env)
                elif kind is not None:
                    # a store of its own per build (named by its label)
                    tag = "-".join(label.replace("(", "").replace(")", "").split()) + f"-{rep}"
                    store_url = {"sqlite": f"sqlite://{work}/{tag}.db",
                                 "json": f"json://{work}/{tag}",
                                 "memory": f"memory://{tag}"}[kind]
                    penv = dict(env, PYTHONPATH=path) if path else env
                    proxy, url = sl.start([sl.CHATSTATE, "--allow-ephemeral", "--store",
                                           store_url, "serve", "--upstream", base, "--port",
                                           "0"], r"serving on (http://\S+/v1)", penv)
                try:
                    asyncio.run(sl.wave(url, 4, "warm"))  # imports and connections
                    started = cpu_seconds(proxy)
                    results = asyncio.run(sl.wave(url, args.conversations, None))
                    spent = cpu_seconds(proxy) - started
                finally:
                    if proxy is not None:
                        os.killpg(proxy.pid, signal.SIGTERM)
                        proxy.wait(60)
                p50 = sl.pct([r[0] for r in results], .5)
                p90 = sl.pct([r[0] for r in results], .9)
                added = ratio = added90 = ratio90 = lost = dup = "-"
                if kind is None:
                    direct, direct90 = p50, p90
                else:
                    added = f"{(p50 - direct) * 1000:+.0f}"
                    added90 = f"{(p90 - direct90) * 1000:+.0f}"
                    if kind == "floor":
                        floor, floor90 = p50 - direct, p90 - direct90
                    else:
                        ratio = f"{(p50 - direct) / floor:.2f}" if floor > 0 else "-"
                        ratio90 = f"{(p90 - direct90) / floor90:.2f}" if floor90 > 0 else "-"
                        if kind != "memory":  # gone with the proxy: nothing to check
                            lost_n, dup_n = sl.check(store_url, results)
                            lost, dup = str(lost_n), str(dup_n)
                cpu = f"{spent:.2f}" if proxy is not None else "-"
                print(f"| {rep} | {label} | {p50 * 1000:.0f} | {added} | {ratio} | "
                      f"{p90 * 1000:.0f} | {added90} | {ratio90} | {cpu} | {lost} | {dup} |",
                      flush=True)
    finally:
        fake.send_signal(signal.SIGINT)
        fake.wait(30)


if __name__ == "__main__":
    main()
