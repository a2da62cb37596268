"""Tier 2 disk faults: real syscalls fail or SIGKILL the writer, injected by strace.

A warmed-up fork server (``tests/support/fault_writer.py serve``) forks one writer per
round. The writer opens the store, says ready, and strace attaches to it with
``-e inject=X:error=E:when=K`` (or ``:signal=SIGKILL``), so K counts the X
syscalls of the operation itself, not of interpreter start-up. The operation is
one turn as the session writes it: append the user message, save a partial
reply, append the complete reply. K sweeps 1, 2, ... until the writer runs
through without the injection firing (capped at ``CAP``). This reaches
SQLite's own I/O (``pwrite64``, ``fdatasync``), which monkeypatching cannot.

Every round, the writer either succeeds or exits 1 with one ``error:`` line
naming the store's path and no traceback; an injected ``fsync``/``fdatasync``
failure on a store file is never followed by an ack. Then, in this process, a
fresh open (recovery) must leave no temp file, the previous transcript must
load and verify with every acked message present once, and re-appending the
writer's sealed messages (an error means "outcome unknown") must store each
exactly once. "rename" in a test id means whichever of ``rename``, ``renameat``
or ``renameat2`` this libc's ``os.replace`` makes (strace finds out once).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.faultlib import CID, PYTHON, WRITER, after_fault, populate, require_tool, run
from support.stores import local_path
from support.tiers import need

from chatstate.core.transcript import Message
from chatstate.stores import open_store

pytestmark = pytest.mark.slow

CAP = 100  # SQLite makes about 60 pwrite64 calls in open() and one turn, checkpoint included
ERRORS = {"fsync": "EIO", "fdatasync": "EIO", "write": "ENOSPC", "pwrite64": "ENOSPC",
          "rename": "EIO", "openat": "EMFILE"}
KILL_AT = ["write", "fsync", "fdatasync", "pwrite64", "rename", "openat", "close", "unlink"]
# Files whose failed fsync may be survived: they hold no transcript data.
BOOKKEEPING = ("/.chatstate/opens.jsonl>", "/.chatstate-probe-")
# The syscalls each store's append really makes here; a sweep over one of them that
# never fires means the injection missed, not that the store is robust.
USES = {"json": {"fsync", "write", "rename", "openat", "close"},
        "sqlite": {"fdatasync", "pwrite64"}}


@functools.cache
def rename_syscall() -> str:
    """The syscall behind os.replace here: rename on x86-64 glibc, renameat2 elsewhere."""
    with_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    probe = run("strace", "-f", "-e", "trace=rename,renameat,renameat2", "-o", "/dev/stdout",
                PYTHON, "-c", "import os, tempfile\n"
                f"d = tempfile.mkdtemp(dir={str(with_dir)!r})\n"
                "open(d + '/a', 'w').close(); os.replace(d + '/a', d + '/b')\n"
                "os.unlink(d + '/b'); os.rmdir(d)")
    calls = {line.split()[1].split("(")[0] for line in probe.stdout.splitlines()
             if "rename" in line and "(" in line}
    assert len(calls) == 1, f"os.replace made {calls or 'no rename call'}: {probe.stderr}"
    return calls.pop()


def real(syscall: str) -> str:
    return rename_syscall() if syscall == "rename" else syscall


@dataclass
class Round:
    status: int
    reports: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    trace: list[str] = field(default_factory=list)

    @property
    def injected(self) -> list[int]:
        return [i for i, line in enumerate(self.trace) if "(INJECTED)" in line]

    @property
    def acked(self) -> list[list[Any]]:
        return [r["ack"] for r in self.reports if "ack" in r]

    @property
    def sealed(self) -> list[Message]:
        found = [r["sealed"] for r in self.reports if "sealed" in r]
        return [Message.model_validate(m) for m in found[0]] if found else []

    def describe(self) -> str:
        return (f"status {self.status}\nreports {self.reports}\nstderr:\n{self.stderr}\n"
                "trace:\n" + "\n".join(self.trace[-15:]))


class ForkServer:
    """tests/support/fault_writer.py serve: forks a writer per round and reports over a socket."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sock, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        (tmp / "warm").mkdir()
        self.proc = subprocess.Popen(
            [PYTHON, str(WRITER), "serve", str(child_end.fileno()), str(tmp / "warm")],
            pass_fds=[child_end.fileno()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        child_end.close()
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)
        self.sock.close()

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _recv(self) -> dict[str, Any]:
        self.sock.settimeout(30)
        result: dict[str, Any] = json.loads(self.sock.recv(1 << 20))
        return result

    def round(self, url: str, tag: str, strace: list[str], scope: str = "turn") -> Round:
        """One writer, with strace attached (and injecting) once it is ready: for scope
        "turn" after it opened the store, for "open" before (open() is recovery)."""
        err, log = self.tmp / "stderr", self.tmp / "trace"
        self._send(json.dumps({"url": url, "cid": CID, "scope": scope, "tag": tag,
                               "stderr": str(err)}))
        pid = self._recv()["pid"]
        ready = self._recv()
        assert ready == {"ready": True}, f"the writer could not open {url}: {ready}"
        tracer = subprocess.Popen(["strace", "-f", "-y", "-o", str(log), *strace,
                                   "-p", str(pid)], stderr=subprocess.PIPE, text=True)
        assert tracer.stderr is not None
        attached = tracer.stderr.readline()
        assert "attached" in attached, attached
        self._send("go")
        assert self.proc.stdout is not None
        done = self.proc.stdout.readline()
        assert done.startswith("done "), f"the fork server died: {done!r}"
        tracer.wait(30)
        rnd = Round(int(done.split()[1]), stderr=err.read_text(),
                    trace=log.read_text().splitlines())
        self.sock.setblocking(False)
        try:
            while True:
                rnd.reports.append(json.loads(self.sock.recv(1 << 20)))
        except BlockingIOError:
            pass
        return rnd


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    require_tool("strace", tier="strace")
    probe = run("strace", "-f", "-e", "trace=getpid", "-o", "/dev/null", PYTHON, "-c", "1")
    need("strace", probe.returncode == 0,
         f"strace cannot trace here (ptrace refused?): {probe.stderr.strip()}")
    srv = ForkServer(tmp_path_factory.mktemp("forkserver"))
    yield srv
    srv.close()


class Sweep:
    """A pristine populated store, copied back before every round of a sweep.

    It holds six messages, an interrupted reply (a partial for seq 6, which the
    turn's own messages replace) and, for json, a dead writer's temp file, so
    open() has something to recover.
    """

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        template = tmp / "template"
        url = f"json://{template}/store" if kind == "json" else f"sqlite://{template}/s.db"
        self.prev = populate(url)
        store = open_store(url)
        store.save_partial(CID, Message.seal(self.prev[-1], role="assistant", turn_id="t-old",
                                             content="cut off", status="partial"))
        store.close()
        if kind == "json":
            (template / "store" / f".{CID}.json.tmp-{'0' * 16}").write_bytes(b"half")
        self.template, self.work = template, tmp / "work"
        self.url = url.replace(str(template), str(self.work))
        self.path = local_path(self.url)

    def reset(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.copytree(self.template, self.work)


def check_error_round(rnd: Round, syscall: str, sweep: Sweep) -> None:
    """Success, or exit 1 with one clear error naming the path; and a failed fsync is no ack."""
    if rnd.status == 0:
        assert {"ok": True} in rnd.reports, rnd.describe()
    else:
        assert os.WIFEXITED(rnd.status), rnd.describe()
        assert os.WEXITSTATUS(rnd.status) == 1, rnd.describe()
        assert "Traceback" not in rnd.stderr, rnd.describe()
        error = next(r for r in rnd.reports if "error" in r)
        assert str(sweep.path) in error["message"], rnd.describe()
        assert rnd.stderr.count("error: ") == 1
        assert str(sweep.path) in rnd.stderr
    if syscall in ("fsync", "fdatasync") and rnd.injected:
        first = rnd.injected[0]
        if any(book in rnd.trace[first] for book in BOOKKEEPING):
            return  # not transcript data: the open record and the guard's probe
        acks_after = [line for line in rnd.trace[first:] if 'sendto(' in line and '"ack"' in line]
        assert not acks_after, f"an ack after a failed {syscall}:\n{rnd.describe()}"


@pytest.mark.invariant(3)
@pytest.mark.parametrize("scope", ["turn", "open"])
@pytest.mark.parametrize("syscall", list(ERRORS))
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_injected_errors(server: ForkServer, tmp_path: Path, kind: str, syscall: str,
                         scope: str) -> None:
    """The K-th ``syscall`` of the turn (scope "open": of open() and then the turn) fails
    with a real errno, for every K."""
    sweep = Sweep(kind, tmp_path)
    errno_name, call = ERRORS[syscall], real(syscall)
    hits = landed = 0
    for k in range(1, CAP + 1):
        sweep.reset()
        rnd = server.round(sweep.url, f"{kind}-{syscall}-{k}", [
            "-e", f"trace={call},sendto", "-e", f"inject={call}:error={errno_name}:when={k}"],
            scope)
        check_error_round(rnd, syscall, sweep)
        verdict = after_fault(sweep.url, CID, sweep.prev, rnd.acked, rnd.sealed)
        assert not verdict.problems, f"K={k}: {verdict.problems}\n{rnd.describe()}"
        landed += verdict.landed_unacked
        if verdict.landed_unacked and rnd.status != 0:  # the error must not deny it landed
            error = next(r for r in rnd.reports if "error" in r)["message"]
            assert "unchanged" not in error, f"K={k}: {error}\n{rnd.describe()}"
        if not rnd.injected:
            break
        hits += 1
    else:
        pytest.fail(f"{syscall} still fired at K={CAP}: raise CAP")
    print(f"{kind} {scope} {syscall}={errno_name}: {hits} fault points, {landed} messages landed "
          "despite the error (retry did not duplicate them)")
    if syscall in USES[kind]:
        assert hits > 0, f"the injection never fired: does {kind} still call {syscall}?"
    if (kind, syscall, scope) == ("json", "fsync", "turn"):
        assert landed > 0, "a failed directory fsync after the rename should leave it landed"


@pytest.mark.invariant(4)
@pytest.mark.parametrize("scope", ["turn", "open"])
@pytest.mark.parametrize("syscall", KILL_AT)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_sigkill_at_every_syscall(server: ForkServer, tmp_path: Path, kind: str,
                                  syscall: str, scope: str) -> None:
    """SIGKILL on entering the K-th ``syscall`` of the turn (scope "open": of open() and
    then the turn): acked messages survive, the chain is valid, recovery cleans up."""
    sweep = Sweep(kind, tmp_path)
    kills, call = 0, real(syscall)
    for k in range(1, CAP + 1):
        sweep.reset()
        rnd = server.round(sweep.url, f"{kind}-kill-{syscall}-{k}", [
            "-e", f"trace={call}", "-e", f"inject={call}:signal=SIGKILL:when={k}"], scope)
        if rnd.status == 0:
            assert {"ok": True} in rnd.reports, rnd.describe()
        else:
            assert os.WIFSIGNALED(rnd.status), rnd.describe()
            assert os.WTERMSIG(rnd.status) == signal.SIGKILL, rnd.describe()
            kills += 1
        verdict = after_fault(sweep.url, CID, sweep.prev, rnd.acked, rnd.sealed)
        assert not verdict.problems, f"K={k}: {verdict.problems}\n{rnd.describe()}"
        if rnd.status == 0:
            break
    else:
        pytest.fail(f"{syscall} still fired at K={CAP}: raise CAP")
    print(f"{kind} {scope}: killed at {kills} {syscall} calls")
    if syscall in USES[kind]:
        assert kills > 0


def test_os_replace_is_one_rename_syscall() -> None:
    """The sweeps inject whatever os.replace calls; say which, and that it is only one."""
    require_tool("strace", tier="strace")
    assert rename_syscall() in ("rename", "renameat", "renameat2")
    print(f"os.replace is {rename_syscall()} here")
