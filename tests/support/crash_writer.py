"""A writer run as a subprocess by the store tests; it prints what the store acknowledged.

    crash_writer.py serve   URL CID        a warmed-up fork server: for every "go" line on
                                           stdin, fork a writer that prints "pid <pid>", opens
                                           the store, prints "opened", then appends turns and
                                           saves partials until SIGKILLed; print "done <status>"
                                           once it is reaped
    crash_writer.py contend URL CID N      wait for "go", load and seal the first message,
                                           say "sealed" and wait for "go" again (so that
                                           every writer seals on the same head), then
                                           append N messages, reloading, resealing and
                                           retrying on ConflictError
    crash_writer.py fsize   URL CID LIMIT SIZE
                                           under RLIMIT_FSIZE=LIMIT (SIGXFSZ ignored), append
                                           one SIZE-byte message; print the outcome as JSON

Every acknowledged message is printed as ``ack <seq> <hash>`` and flushed only
*after* ``append`` returned, so the parent knows exactly what was promised durable.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import time

from chatstate.core.transcript import Message
from chatstate.errors import ChatstateError, ConflictError
from chatstate.stores import open_store


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for_go(signal_line: str = "ready") -> None:
    say(signal_line)  # "ready": imports are done, the parent's kill clock starts at "go"
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)


def serve(url: str, cid: str) -> None:
    say("ready")  # imports are done: the parent's kill clock starts at "go", not at exec
    for line in sys.stdin:
        if line.strip() != "go":
            break
        child = os.fork()
        if child == 0:
            try:
                crash(url, cid)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(1)
        # the child's output is all in the pipe before this line: it is dead when reaped
        _pid, status = os.waitpid(child, 0)
        say(f"done {status}")


def crash(url: str, cid: str) -> None:
    say(f"pid {os.getpid()}")
    store = open_store(url)
    conv = store.load(cid)
    say("opened")
    last = conv.last
    n = 0
    while True:
        n += 1
        role = "user" if last is None or last.role == "assistant" else "assistant"
        if role == "assistant":
            # stream a reply: a few partial saves, then the complete message
            text = ""
            for chunk in range(3):
                text += f" chunk{chunk}-{n}" * 8
                store.save_partial(cid, Message.seal(last, role="assistant", content=text,
                                                     turn_id=last.turn_id if last else "t",
                                                     status="partial"))
        msg = Message.seal(last, role=role, content=f"{role} turn {n} " + "x" * (n % 50),
                           turn_id=f"t-{os.getpid()}-{n}" if role == "user" else
                           (last.turn_id if last else "t"))
        store.append(cid, [msg])
        say(f"ack {msg.seq} {msg.hash}")
        last = msg


def contend(url: str, cid: str, count: int) -> None:
    wait_for_go()
    store = open_store(url)
    conflicts = 0
    for i in range(count):
        while True:
            last = store.load(cid).last
            msg = Message.seal(last, role="user", content=f"pid {os.getpid()} #{i}",
                               turn_id=f"t-{os.getpid()}-{i}")
            if i == 0 and conflicts == 0:
                wait_for_go("sealed")  # the parent releases every writer once all have sealed
            time.sleep(random.uniform(0, 0.003))  # widen the window between read and write
            try:
                store.append(cid, [msg])
            except ConflictError:
                conflicts += 1
                continue
            say(f"ack {msg.seq} {msg.hash}")
            break
    say(f"conflicts {conflicts}")
    store.close()


def fsize(url: str, cid: str, limit: int, size: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG instead
    store = open_store(url)
    last = store.load(cid).last
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    msg = Message.seal(last, role="user", content="y" * size, turn_id="t-big")
    try:
        store.append(cid, [msg])
        outcome = {"type": None, "message": "appended"}
    except ChatstateError as exc:
        outcome = {"type": type(exc).__name__, "message": str(exc)}
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    store.close()
    say(json.dumps(outcome))


def main(argv: list[str]) -> None:
    mode, url, cid, *rest = argv
    if mode == "serve":
        serve(url, cid)
    elif mode == "contend":
        contend(url, cid, int(rest[0]))
    elif mode == "fsize":
        fsize(url, cid, int(rest[0]), int(rest[1]))
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
