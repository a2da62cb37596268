"""Where the adapter's configuration comes from, highest priority first.

1. arguments (``ModelSettings(model=...)``, ``make_adapter(model=...)``)
2. ``CHATSTATE_*`` environment variables
3. ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` environment variables
4. a ``.env`` file in the current directory (either spelling)

The key is a ``Secret`` (chatstate.adapter._env) so it never shows in a repr, a log
line or a traceback.
The environment and ``.env`` are read by a small reader of our own (``_env``),
not pydantic-settings, which cost ~50 ms of every `chatstate ask`'s start-up;
the values are validated by this model as before. ``make_adapter`` builds this
model only when a value needs validating (``_env.resolve``): plain text from
the CLI (model, base URL, key) goes around it. Both take their defaults from
``_env.DEFAULTS``, so they are written once.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chatstate.adapter._env import (
    DEFAULT_BASE_URL,
    DEFAULT_MODEL,
    DEFAULTS,
    VARIABLES,
    Secret,
    lookup,
)
from chatstate.adapter.dialects import dialect

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "ModelSettings"]


class ModelSettings(BaseModel):
    """The model endpoint, credentials, timeouts and retry budget.

    ``ModelSettings()`` reads the environment and ``.env``; keyword arguments win.
    """

    model_config = ConfigDict(extra="ignore")

    model: str = DEFAULTS.model
    base_url: str = DEFAULTS.base_url
    api_key: Secret | None = DEFAULTS.api_key
    timeout: float | None = Field(default=DEFAULTS.timeout, gt=0,
                                  description="read timeout, seconds")
    connect_timeout: float = Field(default=DEFAULTS.connect_timeout, gt=0)
    max_retries: int = Field(default=DEFAULTS.max_retries, ge=0)
    backoff_base: float = Field(default=DEFAULTS.backoff_base, ge=0,
                                description="first retry waits about this long")
    backoff_max: float = Field(default=DEFAULTS.backoff_max, ge=0)
    retry_after_max: float = Field(default=DEFAULTS.retry_after_max, ge=0,
                                   description="cap on a server's Retry-After")
    api: str = Field(default=DEFAULTS.api, description="the wire API (dialect) spoken")

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**lookup(VARIABLES), **values})

    @field_validator("api")
    @classmethod
    def _known_api(cls, value: str) -> str:
        dialect(value)  # ValueError naming the known dialects
        return value
