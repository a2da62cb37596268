"""Writers run as subprocesses by the fault suite; each reports what the store acknowledged.

    fault_writer.py serve SOCKFD WARMDIR   a warmed-up fork server for strace sweeps: for every
                                           JSON command line on stdin ({"url", "cid", "scope",
                                           "stderr"}) fork a writer that reports on the
                                           SEQPACKET socket SOCKFD: {"pid"}, {"ready"}, then
                                           after a "go" line on stdin {"sealed"}, {"ack"}...,
                                           {"ok"} or {"error"}; print "done <status>" once
                                           it is reaped
    fault_writer.py populate URL CID N     create CID holding N messages; print their hashes
    fault_writer.py append URL CID [--fill PATH] [--wait]
                                           one turn; --wait: after opening, say "opened" and
                                           wait for a line on stdin; --fill: then fill the disk
                                           at PATH, try the turn, free the space and retry the
                                           same sealed messages; print one JSON outcome
    fault_writer.py check  URL CID         what a fresh open finds, as JSON
    fault_writer.py fill   PATH            write zeros to PATH until the disk is full
    fault_writer.py hold   URL CID N [--no-dir-fsync] [--no-log-fsync] [--sync-off]
                                           N turns (0: until killed), printing "ack SEQ HASH"
                                           after each append, then "holding" with the store open
    fault_writer.py chat   URL CID BASE_URL TURNS [--stream]
                                           after "go" on stdin, open CID through Chat, say
                                           "loaded", and after a second "go" do TURNS turns;
                                           one JSON line per turn or conflict

A turn is what the session writes without the model: the user message, one
partial reply, the complete reply. Acks go out only *after* ``append`` returned.
The serve writers report over a socket (``send`` is not ``write``), so an
injected ``write`` fault only ever hits the store's own I/O or the error text.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from chatstate import Chat, make_adapter
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ChatstateError, ConflictError
from chatstate.stores import open_store

Report = Callable[[dict[str, Any]], None]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def seal_turn(last: Message | None, tag: str) -> tuple[Message, Message, Message]:
    """The user message, a partial reply and the complete reply of one turn."""
    turn_id = f"t-{tag}"
    user = Message.seal(last, role="user", content=f"question {tag}", turn_id=turn_id)
    partial = Message.seal(user, role="assistant", content=f"answer {tag} so f",
                           turn_id=turn_id, status="partial", model="fake-model")
    reply = Message.seal(user, role="assistant", content=f"answer {tag} so far and done",
                         turn_id=turn_id, model="fake-model")
    return user, partial, reply


def write_turn(store: Any, cid: str, tag: str, report: Report) -> None:
    user, partial, reply = seal_turn(store.load(cid).last, tag)
    report({"sealed": [user.model_dump(), reply.model_dump()]})
    store.append(cid, [user])
    report({"ack": [user.seq, user.hash]})
    store.save_partial(cid, partial)
    store.append(cid, [reply])
    report({"ack": [reply.seq, reply.hash]})


# -- serve: the strace fork server -----------------------------------------------------

def warm_up(warm_dir: str) -> None:
    """Run a turn on each store kind once, so no lazy import happens under injection."""
    for url in (f"json://{warm_dir}/store", f"sqlite://{warm_dir}/s.db"):
        store = open_store(url)
        store.create(Conversation(id="warm"))
        write_turn(store, "warm", "warm", lambda _: None)
        store.close()
        for kind in (ChatstateError, ConflictError):
            str(kind("warm"))


def serve(sock_fd: int, warm_dir: str) -> None:
    sock = socket.socket(fileno=sock_fd)
    warm_up(warm_dir)
    say("ready")
    for line in sys.stdin:
        if not line.strip():
            break
        command = json.loads(line)
        child = os.fork()
        if child == 0:
            os._exit(served_writer(sock, command))
        _pid, status = os.waitpid(child, 0)
        say(f"done {status}")


def served_writer(sock: socket.socket, command: dict[str, Any]) -> int:
    def report(obj: dict[str, Any]) -> None:
        sock.send(json.dumps(obj).encode())

    fd = os.open(command["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    report({"pid": os.getpid()})
    try:
        store = open_store(command["url"]) if command["scope"] == "turn" else None
        report({"ready": True})
        if sys.stdin.readline().strip() != "go":
            return 3
        store = store or open_store(command["url"])
        write_turn(store, command["cid"], command["tag"], report)
        store.close()
    except ChatstateError as exc:
        sys.stderr.write(f"error: {exc}\n")
        report({"error": type(exc).__name__, "message": str(exc)})
        return 1
    except BaseException as exc:
        traceback.print_exc()
        report({"crash": repr(exc)})
        return 2
    report({"ok": True})
    return 0


# -- one-shot writers for the mount tier ------------------------------------------------

def fill(path: str) -> int:
    """Write zeros to ``path`` until the disk is full; return the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    written += os.write(fd, b"\0" * size)
            except OSError:
                pass
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    return written


def append_once(url: str, cid: str, *, fill_path: str | None = None,
                wait: bool = False) -> dict[str, Any]:
    """One turn. ``wait``: say "opened" and read a line first (the test changes the mount)."""
    outcome: dict[str, Any] = {"acked": [], "errors": []}

    def report(obj: dict[str, Any]) -> None:
        if "ack" in obj:
            outcome["acked"].append(obj["ack"])
        else:
            outcome.update(obj)

    try:
        store = open_store(url)
    except ChatstateError as exc:
        outcome["errors"].append({"at": "open", "type": type(exc).__name__, "message": str(exc)})
        return outcome
    if wait:
        say("opened")
        sys.stdin.readline()
    if fill_path:
        outcome["filled"] = fill(fill_path)
    try:
        write_turn(store, cid, f"{os.getpid()}", report)
    except ChatstateError as exc:
        outcome["errors"].append({"at": "append", "type": type(exc).__name__,
                                  "message": str(exc)})
        outcome["loaded"] = len(store.load(cid).messages)  # reads still work
        if fill_path:
            os.unlink(fill_path)
            sealed = [Message.model_validate(m) for m in outcome["sealed"]]
            store.append(cid, sealed)  # the same sealed messages, once there is room
            outcome["retried"] = True
    store.close()
    return outcome


def populate(url: str, cid: str, count: int) -> list[str]:
    store = open_store(url)
    store.create(Conversation(id=cid, title="fault test"))
    last = None
    for n in range(count // 2):
        user, _partial, reply = seal_turn(last, f"pre-{n}")
        store.append(cid, [user, reply])
        last = reply
    hashes = [m.hash for m in store.load(cid).messages]
    store.close()
    return hashes


def check(url: str, cid: str) -> dict[str, Any]:
    try:
        store = open_store(url)
        conv = store.load(cid)
    except ChatstateError as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    store.close()
    return {"hashes": [m.hash for m in conv.messages], "verify": conv.verify(),
            "partial": conv.partial.seq if conv.partial else None, "recovery": store.recovery}


# -- hold: the power-loss writer ---------------------------------------------------------

def hold(url: str, cid: str, turns: int, flags: list[str]) -> None:
    if "--no-dir-fsync" in flags:  # the teeth of the power-loss test: skip the directory fsync
        from chatstate.durable import files as _files

        _files.fsync_dir = lambda path: None
    if "--no-log-fsync" in flags:  # the json store's: skip the fsync of each log record
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            base = os.path.basename(path)  # a conversation file, not a temp file or partial
            if not (base.endswith(".json") and not base.startswith(".")
                    and f"{os.sep}.partials{os.sep}" not in path):
                real_fsync(fd)

        os.fsync = fsync
    store = open_store(url)
    if "--sync-off" in flags:
        store.db.execute("PRAGMA synchronous=OFF")
    say("opened")
    n = 0
    while turns == 0 or n < turns:
        n += 1
        write_turn(store, cid, f"{os.getpid()}-{n}",
                   lambda obj: say(f"ack {obj['ack'][0]} {obj['ack'][1]}") if "ack" in obj
                   else None)
    say("holding")
    while True:
        time.sleep(60)


# -- chat: the concurrency worker --------------------------------------------------------

def chat_worker(url: str, cid: str, base_url: str, turns: int, stream: bool) -> None:
    """TURNS turns through Chat, as a careful caller does it on a shared conversation.

    Chat cannot tell a live writer's unfinished turn from a dead one's, so before
    each turn this caller reloads and waits while another writer's turn is open
    (an unfinished turn of its own it retries). A ConflictError means it lost the
    race to append: it backs off, reloads and tries again.
    """
    adapter = make_adapter(base_url=base_url, api_key="worker-key", model="fake-model",
                           max_retries=0)
    say("ready")
    if sys.stdin.readline().strip() != "go":
        return
    chat = Chat(url, conversation_id=cid, adapter=adapter)
    say("loaded")  # the parent releases the workers again once every one has loaded
    if sys.stdin.readline().strip() != "go":
        return
    me = f"pid {os.getpid()} "
    done = waits = 0
    deadline = time.monotonic() + 90
    while done < turns and time.monotonic() < deadline:
        text = f"pid {os.getpid()} turn {done}"
        try:
            turn = chat.interrupted
            own = turn is not None and turn.user_message is not None and \
                turn.user_message.content.startswith(me)
            if turn is not None and not own:
                waits += 1
                time.sleep(random.uniform(0.005, 0.03))
                chat.reload()
                continue
            if turn is not None:
                chat.retry()
            elif stream:
                consume(chat.stream(text))
            else:
                chat.send(text)
        except ConflictError as exc:
            say(json.dumps({"conflict": str(exc)}))
            time.sleep(random.uniform(0.005, 0.03))  # back off, or the losers just spin
            chat.reload()
            continue
        reply = chat.messages[-1]
        user = next(m for m in chat.messages if m.turn_id == reply.turn_id and m.role == "user")
        say(json.dumps({"turn": reply.turn_id, "user": [user.seq, user.hash],
                        "reply": [reply.seq, reply.hash], "text": user.content}))
        done += 1
    say(json.dumps({"done": done, "waits": waits}))


def consume(deltas: Any) -> None:
    for _ in deltas:
        pass


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "serve":
        serve(int(rest[0]), rest[1])
    elif mode == "append":
        fill_path = rest[rest.index("--fill") + 1] if "--fill" in rest else None
        say(json.dumps(append_once(rest[0], rest[1], fill_path=fill_path,
                                   wait="--wait" in rest)))
    elif mode == "fill":
        say(json.dumps(fill(rest[0])))
    elif mode == "populate":
        say(json.dumps(populate(rest[0], rest[1], int(rest[2]))))
    elif mode == "check":
        say(json.dumps(check(rest[0], rest[1])))
    elif mode == "hold":
        hold(rest[0], rest[1], int(rest[2]), rest[3:])
    elif mode == "chat":
        chat_worker(rest[0], rest[1], rest[2], int(rest[3]), "--stream" in rest)
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
