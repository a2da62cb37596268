"""The runner's handle on the writer fork server (``python -m chatstate.drill.writer``).

Events are read straight from the pipe with ``select``, so the runner sees an
"entering a store write" line microseconds after the writer wrote it and can
kill inside that write. The server runs in its own session: a Ctrl-C at the
terminal reaches the runner only, which then stops the server and cleans up.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from chatstate.errors import ChatstateError


class WriterServer:
    """One fork server; ``go`` starts a writer, ``events`` yields what it reports."""

    def __init__(self, url: str, base_url: str, prefix: str, conversations: int,
                 writer_timeout: float, start_timeout: float = 60.0,
                 env: dict[str, str] | None = None) -> None:
        """``env``: the writers' environment (default: this process's, without OPENAI_*)."""
        if env is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chatstate.drill.writer", url, base_url, prefix,
             str(conversations), str(max(1, int(writer_timeout + 1)))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._fd = self.proc.stdout.fileno()
        self._buffer = b""
        self._lines: collections.deque[list[Any]] = collections.deque()
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self.current: int | None = None  # the writer not yet reaped
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        first = self.next(time.monotonic() + start_timeout)
        if first != ["ready"]:
            # the drill's own writer process broke, not a store or the model: the base class
            raise ChatstateError(f"the drill's writer process did not start: {first!r}; "
                                 f"{self.stderr_tail()}")

    def _drain(self, stream: Any) -> None:
        for raw in stream:
            self._stderr.append(raw.decode("utf-8", "replace").rstrip())

    def stderr_tail(self) -> str:
        return " | ".join(self._stderr)[-2000:]

    def next(self, deadline: float) -> list[Any] | None:
        """The next event, or None when ``deadline`` (monotonic) passes first."""
        while not self._lines:
            wait = deadline - time.monotonic()
            if wait <= 0:
                return None
            ready, _, _ = select.select([self._fd], [], [], wait)
            if not ready:
                return None
            chunk = os.read(self._fd, 65536)
            if not chunk:
                # the drill's own writer process broke, not a store or the model: the base class
                raise ChatstateError(f"the drill's writer process exited: {self.stderr_tail()}")
            self._buffer += chunk
            *whole, self._buffer = self._buffer.split(b"\n")
            for line in whole:
                self._lines.append(json.loads(line))
        return self._lines.popleft()

    def go(self, trial: int, seed: int, deadline: float) -> int:
        """Fork a writer; return its pid once it runs."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {trial} {seed}\n".encode())
        self.proc.stdin.flush()
        event = self.next(deadline)
        if event is None or event[0] != "pid":
            # the drill's own writer process broke, not a store or the model: the base class
            raise ChatstateError(f"the drill's writer did not start: {event!r}; "
                                 f"{self.stderr_tail()}")
        self.current = int(event[1])
        return self.current

    def until_reaped(self, pid: int, deadline: float) -> tuple[list[list[Any]], int]:
        """Every remaining event of writer ``pid`` and its wait status."""
        events: list[list[Any]] = []
        while True:
            event = self.next(deadline)
            if event is None:
                kill(pid)
                deadline = time.monotonic() + 30
                continue
            if event[0] == "reaped" and event[1] == pid:
                self.current = None
                return events, int(event[2])
            events.append(event)

    def close(self) -> None:
        """Kill a writer still running (an interrupted drill), then stop the server."""
        if self.current is not None and self.proc.poll() is None:
            kill(self.current)  # the server is waiting for it: reap before closing stdin
            with contextlib.suppress(ChatstateError):
                self.until_reaped(self.current, time.monotonic() + 10)
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def kill(pid: int) -> None:
    # ProcessLookupError: already dead and reaped; its "reaped" line is on its way
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
