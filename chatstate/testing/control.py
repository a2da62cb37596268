"""Script a fake model running in another process (``chatstate fake-server``) over HTTP.

    fake = FakeControl("http://127.0.0.1:8089/v1")
    fake.fail_next(503, times=2)
    fake.request_log

Same methods as ``FakeModel``; stdlib urllib, with proxies bypassed because
the fake is always on loopback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from chatstate.testing._script import Controls

__all__ = ["FakeControl"]


class FakeControl(Controls):
    """The control API of a fake model at ``base_url`` (its ``/v1`` URL or its root)."""

    def __init__(self, base_url: str, *, timeout: float = 5.0) -> None:
        root = base_url.rstrip("/")
        self.url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.base_url = f"{self.url}/v1"
        self._timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return f"FakeControl({self.base_url})"

    def _command(self, command: str, args: dict[str, Any]) -> Any:
        if command == "log":
            return self._call("GET", "/_fake/log", None)
        if command == "reset":
            return self._call("POST", "/_fake/reset", {})["result"]
        return self._call("POST", "/_fake/control", {"command": command, "args": args})["result"]

    def state(self) -> dict[str, Any]:
        """The fake's options, queued faults and rules."""
        result: dict[str, Any] = self._call("GET", "/_fake/state", None)
        return result

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise ValueError(f"fake model at {self.url} refused {path}: {detail}") from exc
