"""What every backend does with an HTTP error status: one AttemptFailed, read by the dialect."""

from __future__ import annotations

from collections.abc import Mapping

from chatstate.adapter._policy import (
    AttemptFailed,
    is_retryable_status,
    parse_retry_after,
    refused_input,
)
from chatstate.adapter.dialects.base import Dialect


def http_failure(dialect: Dialect, status: int, body: object,
                 headers: Mapping[str, str]) -> AttemptFailed:
    """The failure for an HTTP ``status`` reply with error ``body`` (bytes, text or JSON)."""
    details = dialect.error_details(body)
    refused = refused_input(details.provider_message)
    return AttemptFailed(
        "http", f"HTTP {status}", status=status,
        provider_message=details.provider_message, overflow=details.overflow,
        refused=refused, retryable=refused is None and is_retryable_status(status),
        retry_after=parse_retry_after(headers),
    )
