"""One ``chatstate rekey`` in place, as a real process the rekey drill SIGKILLs
(``RekeyRun``): its output read as it comes, its first line timed, the kill aimed at
a moment of its run and never at a pid already reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from chatstate.drill.plan import spin

NEW_KEY_VAR = "CHATSTATE_DRILL_NEW_KEY"
"""The variable the rekey process reads its new key from (``--new-key-env``)."""


class RekeyRun:
    """``chatstate rekey`` in place as a real process, SIGKILLed ``kill_after`` seconds
    after it started (``from_start``) or after its first line; None: never."""

    def __init__(self, url: str, env: dict[str, str], kill_after: float | None = None,
                 from_start: bool = False) -> None:
        self.keys = [env[k] for k in ("CHATSTATE_ENCRYPTION_KEY", NEW_KEY_VAR)]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chatstate", "rekey", "--new-key-env", NEW_KEY_VAR],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True)
        self.lines: list[str] = []
        self.begun = threading.Event()
        self.killed = False
        self.first: float | None = None
        self.code: int | None = None
        self.seconds = self.work = 0.0
        self.ended = self.started
        self._kill_at = None if kill_after is None else \
            (self.started + kill_after if from_start else kill_after)
        self._from_start = from_start
        self._lock = threading.Lock()  # a kill never reaches a pid reaped (and reused)
        self._reaped = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if kill_after is not None and from_start:
            threading.Thread(target=self._kill_when, args=(self.started + kill_after,),
                             daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.lines.append(line)
            if self.first is None and ("rotation started" in line or "re-encrypted" in line):
                self.first = time.monotonic()
                self.begun.set()
                if self._kill_at is not None and not self._from_start:
                    threading.Thread(target=self._kill_when,
                                     args=(self.first + self._kill_at,), daemon=True).start()
        with self._lock:  # reaped at once, as its parent would: a lease it held while
            self.code = self.proc.wait()  # killed is then known dead (and taken over)
            self._reaped = True
        self.ended = time.monotonic()
        self.begun.set()  # it ended: a writer need not wait for it

    def _kill_when(self, at: float) -> None:
        wait = at - time.monotonic()
        if wait > 0.002:
            time.sleep(wait - 0.002)
        spin(max(0.0, at - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        with self._lock:
            if not self._reaped:
                self.killed = True
                os.kill(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> None:
        self._reader.join(timeout)
        if self._reader.is_alive():  # hung: killed, and reported as not completing
            self._kill()
            self._reader.join()
        end = self.ended
        self.seconds = end - self.started
        self.work = end - (self.first or end)
        if self.code == -signal.SIGKILL and not self.killed:
            self.killed = True  # by someone else: still a kill, but not one it finished

    @property
    def leaked(self) -> bool:
        return any(key in line for line in self.lines for key in self.keys)

    def tail(self) -> str:
        return " | ".join(self.lines[-6:])[-1500:]
