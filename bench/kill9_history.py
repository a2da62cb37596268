"""kill -9 trials against a chat history's add_messages; prints one JSON tally.

    python bench/kill9_history.py SYSTEM DIR --trials N [--seed S]

SYSTEM is ``chatstate-json``, ``chatstate-sqlite`` (run with the project's python)
or ``langchain-file`` (LangChain's FileChatMessageHistory; run with a python that has
langchain-community). Standalone on purpose: it runs in either virtualenv.

A trial forks a writer (the library is imported once, so a trial costs milliseconds,
not an interpreter start): the writer opens a fresh history and calls
``add_messages([HumanMessage(i), AIMessage(i)])`` in a loop, writing ``i`` to a pipe
after each call returns (the acknowledgement). The parent waits for a random number
of acks plus a random delay, SIGKILLs the writer, collects every ack it wrote, then
reads the history back with a new object. A trial is *unreadable* if reading raises
(or shows messages out of order), *torn* if it shows half a batch, and *lost* if an
acknowledged batch is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any


def make_history(system: str, root: Path, trial: int) -> Any:
    if system == "langchain-file":
        from langchain_community.chat_message_histories import FileChatMessageHistory

        return FileChatMessageHistory(str(root / f"trial-{trial}.json"))
    from chatstate.integrations.langchain import ChatstateChatMessageHistory

    url = f"json://{root}/store" if system == "chatstate-json" else f"sqlite://{root}/s.db"
    return ChatstateChatMessageHistory(f"trial-{trial}", store=url)


def writer(system: str, root: Path, trial: int, fd: int) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    history = make_history(system, root, trial)
    for i in range(10**6):
        history.add_messages([HumanMessage(content=f"q{i} " + "x" * 200),
                              AIMessage(content=f"a{i} " + "y" * 400)])
        os.write(fd, f"{i}\n".encode())


def read_acks(fd: int, want: int, deadline: float) -> list[int]:
    buf = b""
    while buf.count(b"\n") < want and time.monotonic() < deadline:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return [int(x) for x in buf.split()]


def check(system: str, root: Path, trial: int, acked: int) -> dict[str, Any]:
    """One trial read back with a fresh history object: unreadable, torn (a batch half
    there), lost (an acknowledged batch missing)."""
    try:
        history = make_history(system, root, trial)
        texts = [str(m.content).split(" ", 1)[0] for m in history.messages]
        close = getattr(history, "close", None)
        if close is not None:
            close()
    except Exception as exc:  # any failure to read the history back
        return {"unreadable": True, "torn": False, "lost": acked > 0,
                "note": f"{type(exc).__name__}: {str(exc)[:80]}"}
    whole = len(texts) // 2
    if texts[:2 * whole] != [f"{k}{i}" for i in range(whole) for k in ("q", "a")]:
        return {"unreadable": True, "torn": False, "lost": True,
                "note": f"out of order: {texts[:4]}"}
    torn = len(texts) % 2 == 1
    return {"unreadable": False, "torn": torn, "lost": whole < acked,
            "note": f"half a batch: ends {texts[-3:]}" if torn else ""}


def trial(system: str, root: Path, n: int, rng: random.Random) -> dict[str, Any]:
    target, delay = rng.randint(0, 6), rng.uniform(0, 0.02)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer
        os.close(read_fd)
        try:
            writer(system, root, n, write_fd)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(write_fd)
    acks = read_acks(read_fd, target, time.monotonic() + 30)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status):  # the writer failed by itself: a harness error
        raise SystemExit(f"{system}: the writer of trial {n} exited before the kill "
                         f"(status {status}); see its traceback above")
    rest = b""
    while chunk := os.read(read_fd, 4096):  # acks written before it died count
        rest += chunk
    os.close(read_fd)
    acked = len(acks) + len(rest.split())
    return {"acked": acked, **check(system, root, n, acked)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=["chatstate-json", "chatstate-sqlite",
                                           "langchain-file"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    args.dir = args.dir.resolve()
    args.dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    results = [trial(args.system, args.dir, n, rng) for n in range(args.trials)]
    notes = sorted({r["note"] for r in results if r["note"]})[:5]
    print(json.dumps({"system": args.system, "trials": len(results),
                      "acked": sum(r["acked"] for r in results),
                      "unreadable": sum(r["unreadable"] for r in results),
                      "torn": sum(r["torn"] for r in results),
                      "lost": sum(r["lost"] for r in results), "notes": notes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
