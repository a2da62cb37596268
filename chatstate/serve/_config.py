"""What ``chatstate serve`` runs with (``ServeConfig``: the CLI's options as values)."""

from __future__ import annotations

from dataclasses import dataclass, field

from chatstate.serve._offload import (
    MAX_DEPTH,
    MAX_MESSAGES,
)
from chatstate.stores.base import Store


@dataclass
class ServeConfig:
    store: Store
    upstream: str
    api_key: str | None = None
    tokens: list[str] = field(default_factory=list)
    pass_client_key: bool = False
    max_body: int = 32 * 1024 * 1024
    ready_upstream: bool = False
    timeout: float | None = 60.0
    connect_timeout: float = 10.0
    lease_wait: float = 0.0  # seconds a turn waits for another live writer, then 409
    max_messages: int = MAX_MESSAGES  # more in one request: 413
    max_depth: int = MAX_DEPTH  # JSON nested deeper: 400
    max_concurrent: int | None = None  # turns in flight per namespace, then 429
    rate: float | None = None  # requests per second per namespace, then 429
    ready_cache: float = 1.0  # seconds /readyz reuses its last store probe
    allowed_hosts: list[str] = field(default_factory=list)  # beyond loopback and IP literals
    worker_threads: int = 64
    """Threads for blocking work (store calls, parsing): a burst's writers share commits."""
