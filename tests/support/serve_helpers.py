"""``chatstate serve`` as a real subprocess on loopback, in front of the fake model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from support.cli_helpers import CHATSTATE

SERVING = re.compile(r"serving on (http://[^ ]+/v1)")


def local_url(kind: str, base: Path) -> str:
    """A json or sqlite store URL under ``base``."""
    return f"json://{base}/store" if kind == "json" else f"sqlite://{base}/s.db"


class ServeProcess:
    """``chatstate --store URL serve --upstream UPSTREAM --port 0 ARGS``; stderr is kept."""

    def __init__(self, store: str, upstream: str, env: dict[str, str], *args: str,
                 global_args: tuple[str, ...] = ()) -> None:
        argv = [CHATSTATE, "--store", store, *global_args, "serve", "--upstream", upstream,
                "--port", "0", *args]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.base_url = ""
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                match = SERVING.search(line)
                if match:
                    self.base_url = match.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or not self.base_url:
            self.stop()
            raise RuntimeError("serve did not start:\n" + "\n".join(self.lines))
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx2

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx2.get(self.root + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx2.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("serve never answered /healthz:\n" + "\n".join(self.lines))

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    from support.cli_helpers import cli_env

    env = cli_env(tmp_path, **extra)
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p.endswith("tests")))
    return env
