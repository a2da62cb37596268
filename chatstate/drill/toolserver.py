"""The tool drill's handle on its writer fork server (``python -m chatstate.drill.toolwriter``).

The server's stdout is one JSON object per line, read by a thread into a queue;
``go`` starts a writer, ``until`` collects what it says up to a given line, and
``kill`` SIGKILLs it and waits until the server has reaped it, so everything
the writer printed has been read. The server runs in its own session: a
Ctrl-C at the terminal reaches the drill only, which then closes it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ToolWriters"]


class ToolWriters:
    """The ``toolwriter`` fork server: one JSON object per stdout line, read by a thread."""

    def __init__(self, url: str, base_url: str, effects: Path, writer_timeout: int,
                 mcp: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_",))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chatstate.drill.toolwriter", url, base_url, str(effects),
             str(writer_timeout), *([str(mcp)] if mcp else [])], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        self.lines: queue.Queue[Any] = queue.Queue()
        self.early: list[dict[str, Any]] = []
        threading.Thread(target=self._pump, daemon=True).start()
        if self.next(timeout=120) != "ready":
            raise RuntimeError("the tool drill's writer did not start")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(EOFError)

    def next(self, timeout: float = 60) -> Any:
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the tool drill's writer said nothing for {timeout} s") from None
        if item is EOFError:
            self.proc.kill()
            raise RuntimeError(f"the tool drill's writer exited: {self.proc.communicate()[1]}")
        return item

    def go(self, cid: str, step: str, mode: str) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {cid} {step} {mode}\n")
        self.proc.stdin.flush()
        while "pid" not in (item := self.next()):
            self.early.append(item)
        return int(item["pid"])

    def until(self, pid: int, *, stop: tuple[str, ...], timeout: float = 60
              ) -> list[dict[str, Any]]:
        """What the writer said until a line has a key in ``stop`` (or it was reaped)."""
        out, self.early = self.early, []
        deadline = time.monotonic() + timeout
        while not any(k in line for line in out for k in stop):
            item = self.next(timeout=max(deadline - time.monotonic(), 0.01))
            out.append(item)
            if item.get("reaped") == pid:
                break
        return out

    def kill(self, pid: int) -> list[dict[str, Any]]:
        """SIGKILL the writer; everything it said, once the server has reaped it."""
        os.kill(pid, signal.SIGKILL)
        return self.until(pid, stop=("reaped",))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
